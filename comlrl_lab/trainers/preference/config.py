"""The four preference-trainer configs: CoMLRL 1.4.3's fields, defaults, aliases and validation messages.

``MADPOConfig`` holds everything the trainers share, ``MARLHFConfig`` adds reward-model and online-RL
fields, and ``_IterativePreferenceConfig`` adds the comparator and replay-buffer fields of the two Iter
configs. Every field carries ``metadata["help"]``, the one text shown as UI tooltip, CLI help and docs, and
``metadata["group"]``, the section the Setup form and the docs put it in.

The config is the only validator: ``__post_init__`` checks every field and raises ``ConfigError`` (a
``ValueError`` whose message is CoMLRL's where CoMLRL has one) naming the field it is about; the code below the
config takes the typed config and trusts it. The metadata holds the rest of what a field is:

- ``"choices"`` (the canonical values), ``"aliases"`` (other spelling -> canonical value), ``"choice_help"``
  (a note per value), ``"exact"`` (no case folding), ``"refusal"`` (CoMLRL's wording of an unknown name, when it
  is not "must be one of") and ``"suggest"`` (an unknown name gets a did-you-mean hint). These are the only lists
  of allowed values: validation, the text codec (``fields.py``), the Setup form and the docs read them.
- ``"applies_when"`` (controlling field -> the values under which the field means anything). With ``"strict"``
  the config refuses the field set elsewhere (``"tolerated"``: a value CoMLRL lets through under a controlling
  value anyway) and, with ``"required"``, left empty where it applies. The Setup form hides a field that does not
  apply and leaves it out.
- ``"suggested"`` (what the form fills in when the field becomes required), ``"none_means"`` (what None
  stands for) and ``"symbol"`` (the paper's name of the value, for short labels: k, λ).

This module does not import torch, resolve devices, read the environment or touch the file system: a
config can be built, checked and serialised anywhere (the Streamlit form, the CLI, a notebook).

Fields of our own (``seed``, ``disable_dropout``, ``score_final_token``, batch sizes, ``output_dir``,
``max_grad_norm``, ``bt_validation_fraction``, API retry/concurrency settings) are keyword-only, so the
positional order of CoMLRL's fields is unchanged. See docs/differences_from_comlrl.md.
"""

from __future__ import annotations

import copy
import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

from comlrl_lab.trainers.preference import credentials

__all__ = [
    "CONFIG_CLASSES",
    "ConfigError",
    "MADPOConfig",
    "MADPOIterConfig",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "SECRET_FIELDS",
    "check_choice",
    "check_field_names",
    "choose",
    "field_aliases",
    "field_choices",
    "field_multi_choices",
    "resolve_choice",
]

# rl_algorithm decides the advantage baseline of the MAGRPO family; actor-critic leaves advantage_mode alone.
MAGRPO_FAMILY_ADVANTAGE_MODE: dict[str, str] = {
    "magrpo": "mean",
    "mareinforce": "raw",
    "maremax": "max",
    "marloo": "rloo",
}

#: What the labelling view shows above each comparison unless the spec says otherwise (label_guideline).
DEFAULT_LABEL_GUIDELINE = (
    "Read the prompt(s), then both joint responses: every agent's part together. Choose A or B for the joint "
    "response that better does what the prompt asks, tie when neither is better, both bad when neither is "
    "acceptable. Judge the responses, not their length; skip when unsure."
)
#: The placeholders judge_template must contain.
JUDGE_PLACEHOLDERS: tuple[str, ...] = ("{prompt}", "{response_a}", "{response_b}")
DEFAULT_JUDGE_TEMPLATE = (
    "You compare two joint responses of a team of agents to the same task.\n\n"
    "Task:\n{prompt}\n\n"
    "Response A:\n{response_a}\n\n"
    "Response B:\n{response_b}\n\n"
    "Which response better does what the task asks? Answer with one of: A, B, tie, both bad. "
    "Begin your answer with it."
)
SECRET_FIELDS: frozenset[str] = frozenset({"comparator_api_key"})
#: The API comparator's settings mean something only for comparator_policy="api".
_API_ONLY: dict[str, tuple[str, ...]] = {"comparator_policy": ("api",)}
MASK = credentials.MASK


class ConfigError(ValueError):
    """A value a config (or an experiment spec) refuses. ``str(error)`` is the message, CoMLRL's word for word
    where CoMLRL has one; ``field`` names the field it is about, ``value`` holds the value refused (None when the
    field was left empty) and ``suggestion`` a close spelling, when there is one."""

    def __init__(self, message: str, *, field: str, value: Any = None, suggestion: str | None = None):
        super().__init__(message)
        self.field = field
        self.value = value
        self.suggestion = suggestion

    def __reduce__(self) -> tuple:
        # Exceptions pickle as cls(*args); the keyword-only attributes travel as state.
        return (_config_error, (str(self), self.field), {"value": self.value, "suggestion": self.suggestion})


def _config_error(message: str, field: str) -> ConfigError:
    return ConfigError(message, field=field)


def _clean(value: Any) -> str:
    return "" if value is None else str(value).strip().lower()


def _metadata(config_class: type, name: str) -> Mapping[str, Any]:
    return config_class.__dataclass_fields__[name].metadata


def field_choices(config_class: type, name: str) -> tuple[str, ...]:
    """The canonical values of field ``name`` in ``config_class`` (``metadata["choices"]``); () for a free field."""
    return tuple(_metadata(config_class, name).get("choices", ()))


def field_aliases(config_class: type, name: str) -> dict[str, str]:
    """Alias -> canonical value of field ``name`` (``metadata["aliases"]``); the canonical names are not repeated."""
    return dict(_metadata(config_class, name).get("aliases", {}))


def field_multi_choices(config_class: type, name: str) -> tuple[str, ...]:
    """The values a list field such as ``report_to`` may hold (``metadata["multi_choices"]``); () for others."""
    return tuple(_metadata(config_class, name).get("multi_choices", ()))


def resolve(metadata: Mapping[str, Any], value: Any) -> str | None:
    """The canonical value ``value`` spells among ``metadata``'s choices (lower-cased and trimmed, an alias counts;
    as written for an ``"exact"`` field), else None."""
    if metadata.get("exact"):
        return value if isinstance(value, str) and value in metadata["choices"] else None
    key = _clean(value)
    if key in metadata["choices"]:
        return key
    return metadata.get("aliases", {}).get(key)


def choose(name: str, metadata: Mapping[str, Any], value: Any) -> str:
    """The canonical value ``value`` spells, or the ``ConfigError`` that refuses it: CoMLRL's wording
    (``metadata["refusal"]``, by default "must be one of"), or for a field marked ``"suggest"`` one that lists the
    accepted names and aliases and suggests the closest spelling."""
    canonical = resolve(metadata, value)
    if canonical is not None:
        return canonical
    choices = tuple(metadata["choices"])
    if not metadata.get("suggest"):
        template = metadata.get("refusal", "{name} must be one of: {choices}.")
        message = template.format(name=name, choices=", ".join(choices), alternatives=" or ".join(choices))
        raise ConfigError(message, field=name, value=value)
    aliases = list(metadata.get("aliases", {}))
    close = difflib.get_close_matches(_clean(value), [*choices, *aliases], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "."
    raise ConfigError(
        f"{name} {value!r} is not one of: {', '.join(choices)} (aliases: {', '.join(aliases)}){hint}",
        field=name,
        value=value,
        suggestion=close[0] if close else None,
    )


def resolve_choice(config_class: type, name: str, value: Any) -> str | None:
    """The canonical value ``value`` spells for field ``name`` of ``config_class`` (``resolve``), else None."""
    return resolve(_metadata(config_class, name), value)


def check_choice(config_class: type, name: str, value: Any) -> str:
    """The canonical value ``value`` spells for field ``name`` of ``config_class``, else its ``ConfigError``."""
    return choose(name, _metadata(config_class, name), value)


def check_field_names(config_class: type, names: Iterable[str]) -> None:
    """Refuse names that are not fields of ``config_class``: a ``ConfigError`` about the first, with the closest
    field name as its suggestion."""
    known = [f.name for f in fields(config_class)]
    unknown = [name for name in names if name not in known]
    if not unknown:
        return
    close = difflib.get_close_matches(str(unknown[0]), known, n=1, cutoff=0.6)
    if len(unknown) > 1:
        message = f"{config_class.__name__} has no fields {', '.join(repr(n) for n in unknown)}."
    else:
        message = f"{config_class.__name__} has no field {unknown[0]!r}" + (
            f"; did you mean {close[0]!r}?" if close else ""
        )
    raise ConfigError(message, field=unknown[0], suggestion=close[0] if close else None)


def _choose(config: Any, name: str) -> str:
    """Resolve field ``name`` of ``config`` in place (``check_choice``)."""
    canonical = check_choice(type(config), name, getattr(config, name))
    setattr(config, name, canonical)
    return canonical


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _check_int_at_least(
    name: str, value: Any, minimum: int, *, optional: bool = False, says_null: bool = False
) -> None:
    """``says_null``: the message ends "or null.", as CoMLRL words it for the optional fields it checks."""
    if value is None and optional:
        return
    if not _is_int(value):
        raise ConfigError(f"{name} must be an integer, got {value!r}.", field=name, value=value)
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}{' or null' if says_null else ''}.", field=name, value=value)


def _check_positive(name: str, value: Any, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not _is_number(value) or not value > 0:
        raise ConfigError(f"{name} must be > 0.", field=name, value=value)


def _quoted_alternatives(values: tuple[str, ...]) -> str:
    """CoMLRL's list of modes in a message: 'a', 'b', or 'c'."""
    quoted = [repr(v) for v in values]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])}, or {quoted[-1]}"


def _check_dependent(config: Any, name: str, controller: str) -> bool:
    """CoMLRL's rules for field ``name``, which applies only under some values of ``controller`` (its
    ``applies_when``, marked ``"strict"``): set where it does not apply, it is refused (a ``"tolerated"`` value
    aside); ``"required"``, it must be set where it applies. True when it applies and is set, for the caller to
    check its value."""
    metadata = _metadata(type(config), name)
    allowed = tuple(metadata["applies_when"][controller])
    mode, value = getattr(config, controller), getattr(config, name)
    if mode in allowed:
        if value is None and metadata.get("required"):
            raise ConfigError(f"{name} is required when {controller}={mode!r}.", field=name)
        return value is not None
    if value is None:
        return False
    tolerated = metadata.get("tolerated", {})
    if mode in tolerated:
        accepted = tolerated[mode]
        if not (type(value) is type(accepted) and value == accepted):
            raise ConfigError(
                f"{name} must be null or {accepted!r} when {controller}={mode!r}.", field=name, value=value
            )
        return False
    when = f"{controller}={allowed[0]!r}" if len(allowed) == 1 else f"{controller} is {_quoted_alternatives(allowed)}"
    raise ConfigError(f"{name} is only valid when {when}.", field=name, value=value)


def dependents(config_class: type, controller: str) -> list[str]:
    """The fields of ``config_class`` whose ``applies_when`` names ``controller``, in declaration order."""
    return [f.name for f in fields(config_class) if controller in f.metadata.get("applies_when", {})]


def _jsonable(value: Any, path: str, name: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(item, f"{path}[{i}]", name) for i, item in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, f"{path}[{k!r}]", name) for k, v in value.items()}
    # comparator_agents may hold model objects: keep the id they were loaded from, which loads them again.
    model_id = getattr(value, "name_or_path", None) or getattr(getattr(value, "config", None), "_name_or_path", None)
    if isinstance(model_id, str) and model_id:
        return model_id
    raise ConfigError(
        f"{path} holds a {type(value).__name__} without a model id, so the config cannot be serialised.", field=name
    )


@dataclass(repr=False)
class MADPOConfig:
    """Config of ``MADPOTrainer``; every other preference config inherits these fields and checks."""

    num_train_epochs: int = field(
        default=20,
        metadata={
            "help": "MADPO: passes of DPO over the pair set (per round in MADPOIter). MARLHF: online-RL epochs over the train dataset.",
            "group": "Essentials",
        },
    )
    agent_learning_rate: float = field(
        default=5e-6,
        metadata={"help": "Learning rate of each agent's AdamW optimiser (weight decay 0.01).", "group": "Training"},
    )
    logging_steps: int = field(
        default=50,
        metadata={"help": "Minimum gap in environment steps between two training-metric logs.", "group": "Training"},
    )
    num_agents: int = field(
        default=2,
        metadata={
            "help": "Number of agent roles. Centralized collaboration requires it to equal the trainer's num_agents.",
            "group": "Devices and collaboration",
        },
    )
    # CoMLRL compares collaboration_mode exactly: no aliases, no case folding.
    collaboration_mode: str = field(
        default="decentralized",
        metadata={
            "help": "'decentralized' (one model per agent) or 'centralized' (one model writes every role's output).",
            "choices": ("decentralized", "centralized"),
            "exact": True,
            "refusal": "{name} must be {alternatives}.",
            "group": "Devices and collaboration",
        },
    )
    parallel_training: str = field(
        default="none",
        metadata={
            "help": "'none' or 'mp' (one worker thread per agent when agents sit on different devices; needs agent_devices). 'null' means none.",
            "choices": ("none", "mp"),
            "aliases": {"null": "none", "": "none"},
            "refusal": "{name} only supports: {choices}.",
            "group": "Devices and collaboration",
        },
    )
    agent_devices: str | list[str] | None = field(
        default=None,
        metadata={
            "help": "Agent devices: None or 'auto' (cuda:i per agent if enough GPUs, else cuda:0, else cpu), one device for all, or a list of 1 or num_agents devices.",
            "group": "Devices and collaboration",
            "none_means": "automatic",
        },
    )
    max_new_tokens: int = field(
        default=256,
        metadata={
            "help": "Maximum number of generated tokens per response (also sent to the comparator API).",
            "group": "Essentials",
        },
    )
    temperature: float = field(
        default=0.6,
        metadata={"help": "Sampling temperature (generation always samples, one beam).", "group": "Generation"},
    )
    top_p: float = field(default=0.6, metadata={"help": "Nucleus-sampling probability mass.", "group": "Generation"})
    top_k: int | None = field(
        default=50,
        metadata={
            "help": "Top-k sampling cut-off; None disables it.",
            "group": "Generation",
            "none_means": "no cut-off",
        },
    )
    num_turns: int = field(
        default=1,
        metadata={
            "help": "Dialogue turns per episode; preference training supports exactly 1.",
            "group": "Multi-turn (fixed for preference training)",
        },
    )
    discount: float = field(
        default=1.0,
        metadata={
            "help": "Return discount; unused by preference training, passed on to MARLHF actor-critic.",
            "group": "Policy learning (MARLHF)",
        },
    )
    joint_mode: str = field(
        default="aligned",
        metadata={
            "help": "How candidates of different agents form joint responses; preference training requires 'aligned' (checked when training).",
            "group": "Multi-turn (fixed for preference training)",
        },
    )
    early_termination_threshold: float | None = field(
        default=None,
        metadata={
            "help": "Multi-turn early-termination reward threshold; unused with one turn.",
            "group": "Multi-turn (fixed for preference training)",
        },
    )
    external_prompt_passthrough: bool = field(
        default=False,
        metadata={
            "help": "Multi-turn prompt passthrough; unused with one turn.",
            "group": "Multi-turn (fixed for preference training)",
        },
    )
    eval_interval: int = field(
        default=16,
        metadata={
            "help": "MADPO: evaluate before an update when updates_seen % eval_interval == 0. MARLHF RL: every eval_interval prompts. 0 disables.",
            "group": "Evaluation",
        },
    )
    eval_num_samples: int = field(
        default=4, metadata={"help": "Number of eval items per evaluation.", "group": "Evaluation"}
    )
    eval_batch_size: int = field(
        default=1, metadata={"help": "Eval items per evaluation batch.", "group": "Evaluation"}
    )
    rollout_buffer_size: int = field(
        default=2,
        metadata={
            "help": "MARLHF RL: prompts buffered per agent before an update.",
            "group": "Policy learning (MARLHF)",
        },
    )
    train_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "MADPO: pairs per optimiser step. MARLHF RL: samples per step. None -> rollout_buffer_size.",
            "group": "Training",
        },
    )
    advantage_normalization: bool = field(
        default=True,
        metadata={"help": "MARLHF RL: normalise advantages within each group.", "group": "Policy learning (MARLHF)"},
    )
    # CoMLRL never checks advantage_mode (MARLHF configs overwrite it), so an unknown name is kept as given.
    advantage_mode: str = field(
        default="mean",
        metadata={
            "help": "Advantage baseline of MARLHF's MAGRPO family; MARLHF configs overwrite it from rl_algorithm.",
            "choices": tuple(MAGRPO_FAMILY_ADVANTAGE_MODE.values()),
            "checked": False,
            "group": "Policy learning (MARLHF)",
        },
    )
    reference_kl_enabled: bool = field(
        default=False,
        metadata={
            "help": "Load frozen reference models and subtract a sampled KL penalty from MARLHF policy-learning rewards. No effect on the MADPO loss.",
            "group": "Reference KL",
        },
    )
    reference_kl_coef: float = field(
        default=0.1, metadata={"help": "Coefficient of the reference KL penalty (>= 0).", "group": "Reference KL"}
    )
    reference_devices: str | list[str] | None = field(
        default=None,
        metadata={
            "help": "Devices of the reference models: None (the agent devices), one device, or a list of 1 or num_agents devices.",
            "group": "Reference KL",
            "none_means": "the agent devices",
        },
    )
    preference_num_candidates: int = field(
        default=80, metadata={"help": "N: candidates sampled per agent per prompt (>= 2).", "group": "Essentials"}
    )
    preference_pairs_per_sample: int | None = field(
        default=16,
        metadata={
            "help": "Cap on pairs kept per task item; None keeps all (required with pair_selection='all').",
            "group": "Preference pairs",
        },
    )
    pair_selection: str = field(
        default="reward_gap",
        metadata={
            "help": "Which pairs to keep: 'reward_gap' (largest gaps first), 'all' or 'random'; Iter configs add 'comparator_reward'.",
            "choices": ("reward_gap", "all", "random"),
            "group": "Preference pairs",
        },
    )
    dpo_beta: float = field(
        default=0.1,
        metadata={
            "help": "eta in the joint-margin DPO loss -log sigma(eta * sum_i Delta_i) (> 0).",
            "group": "Training",
        },
    )
    use_environment_step: bool = field(
        default=True,
        metadata={"help": "Whether DPO updates advance the environment-step counter.", "group": "Training"},
    )
    environment_steps_per_pair: int = field(
        default=2, metadata={"help": "Environment steps added per pair in each DPO update.", "group": "Training"}
    )
    # Differs from CoMLRL: fields of our own (see the help texts), keyword-only so CoMLRL's positional order holds.
    seed: int = field(
        default=42,
        kw_only=True,
        metadata={
            "help": "Seed of every random stream (generation, pairing, replay sampling, comparator). Same seed, same pairs. CoMLRL is unseeded.",
            "group": "Essentials",
        },
    )
    disable_dropout: bool = field(
        default=True,
        kw_only=True,
        metadata={
            "help": "Turn dropout off in every model while generating and scoring. CoMLRL scores in train mode, with dropout noise.",
            "group": "Training",
        },
    )
    score_final_token: bool = field(
        default=False,
        kw_only=True,
        metadata={
            "help": "Decentralized MADPO: also score the last completion token, including the EOS that ended it. False scores as CoMLRL (last token dropped).",
            "group": "Training",
        },
    )
    generation_batch_size: int | None = field(
        default=None,
        kw_only=True,
        metadata={
            "help": "Sequences per generate call when sampling candidates (>= 1). None: 64, and for batch-invariant sampling as many more, up to 256, as keep a call's KV cache within 1 GiB (its tokens do not depend on the batching).",
            "group": "Generation",
            "none_means": "64, or more within 1 GiB KV",
        },
    )
    scoring_batch_size: int = field(
        default=16,
        kw_only=True,
        metadata={
            "help": "Pairs per scoring micro-batch (winner and loser in one forward; >= 1).",
            "group": "Training",
        },
    )
    pack_pair_scoring: bool = field(
        default=True,
        kw_only=True,
        metadata={
            "help": "MADPO: score each pair as one row [prompt | winner | loser] with a block-causal mask, so the prompt runs once per pair; the same log-probs up to float rounding. Used where the model takes custom masks (sdpa or eager attention); False, or other models, score winner and loser as two rows.",
            "group": "Training",
        },
    )
    output_dir: str | None = field(
        default=None,
        kw_only=True,
        metadata={
            "help": "Run directory for replay files, checkpoints and the store; None -> ./runs/<run id>. A run never overwrites another run's files.",
            "group": "Training",
        },
    )
    madpo_reference: str = field(
        default="none",
        kw_only=True,
        metadata={
            "help": "MADPO only. 'none' (CoMLRL): reference-free margins. 'initial': each agent's margin is measured against a frozen copy of its initial policy, as in standard DPO (log-probs taken once when a pair is collected; with LoRA the frozen base, at no memory cost).",
            "choices": ("none", "initial"),
            "group": "MADPO stabilisers",
        },
    )
    madpo_length_normalize: bool = field(
        default=False,
        kw_only=True,
        metadata={
            "help": "MADPO only. Margins from the mean per-token log-prob instead of the sum (SimPO-style), so a longer winner is not penalised for its length. False = CoMLRL.",
            "group": "MADPO stabilisers",
        },
    )
    madpo_nll_weight: float = field(
        default=0.0,
        kw_only=True,
        metadata={
            "help": "MADPO only. Adds this weight times the winner's per-token negative log-likelihood to each agent's loss (as in RPO), so the winner's likelihood cannot fall (>= 0; 0 = CoMLRL).",
            "group": "MADPO stabilisers",
        },
    )
    eval_samples_per_item: int = field(
        default=1,
        kw_only=True,
        metadata={
            "help": "Responses sampled per eval item in each evaluation (>= 1; 1 = CoMLRL). Every round draws the same per-item seeds; with 2 or more the reported standard error is the within-item (stratified) one: the sampling error for this fixed eval set.",
            "group": "Evaluation",
        },
    )
    max_grad_norm: float | None = field(
        default=None,
        kw_only=True,
        metadata={
            "help": "Clip each agent's gradient norm to this value (> 0); None = no clipping, as CoMLRL.",
            "group": "Training",
        },
    )
    report_to: list[str] | None = field(
        default=None,
        kw_only=True,
        metadata={
            "help": "Trackers that receive each round's metrics besides the store: wandb (project, entity, name and tags from the trainer's wandb_config; pip install comlrl-lab[wandb]), tensorboard (event files in <output_dir>/tensorboard; pip install comlrl-lab[tensorboard]) or none. None = wandb when a wandb_config is given, else none.",
            "group": "Logging",
            "multi_choices": ("wandb", "tensorboard", "none"),
        },
    )
    batch_invariant_sampling: bool = field(
        default=True,
        kw_only=True,
        metadata={
            "help": "Sample every (round, item, agent, candidate) row from its own seed, so batch size, batching order and the number of torchrun ranks never change a row's random draws (nor its tokens, unless the logits themselves shift with the batch shape). False samples each agent's rows from one stream, so the tokens depend on the batching.",
            "group": "Generation",
        },
    )
    use_chat_template: str = field(
        default="auto",
        kw_only=True,
        metadata={
            "help": "Send each agent's prompt as one user message through its tokenizer's chat template (apply_chat_template with add_generation_prompt=True) and stop a response at the template's end-of-turn token; the rendered prompt is what pairs and exports keep. 'auto': when the tokenizer has a template (instruction-tuned models; the embedded tiny model has none), 'true': always (an error without a template), 'false': never, as CoMLRL.",
            "choices": ("auto", "true", "false"),
            "group": "Generation",
        },
    )
    lora_r: int | None = field(
        default=None,
        kw_only=True,
        metadata={
            "help": "LoRA rank (>= 1): train peft LoRA adapters on each agent instead of all weights; checkpoints, snapshots and save_model keep adapters only. None trains every weight (needs peft).",
            "group": "Large models",
        },
    )
    lora_alpha: float = field(
        default=16.0,
        kw_only=True,
        metadata={"help": "LoRA scaling alpha (> 0); used when lora_r is set.", "group": "Large models"},
    )
    lora_dropout: float = field(
        default=0.0,
        kw_only=True,
        metadata={"help": "Dropout on the LoRA input, in [0, 1); used when lora_r is set.", "group": "Large models"},
    )
    lora_target_modules: str | list[str] | None = field(
        default=None,
        kw_only=True,
        metadata={
            "help": "Module names that get LoRA adapters (e.g. ['q_proj', 'v_proj'] or 'all-linear'); None lets peft choose for the architecture.",
            "group": "Large models",
        },
    )
    save_strategy: str = field(
        default="phase",
        kw_only=True,
        metadata={
            "help": "When a checkpoint is written (given a checkpoint_dir): 'phase' after every phase, 'round' after each round's last phase, 'no' never. Weights are written only when training changed them.",
            "choices": ("phase", "round", "no"),
            "aliases": {"epoch": "round", "none": "no"},
            "group": "Training",
        },
    )
    concurrent_cpu_agents: bool = field(
        default=False,
        kw_only=True,
        metadata={
            "help": "Agents all on the CPU (two or more, on a machine with two or more cores): sample, evaluate and score each agent in its own thread, torch's intra-op threads split between them (the count is process-wide, so another run in the same process sees the split while they run). The same samples from the same weights; with more than one torch thread the split can change how torch sums in the last bits, so later rounds' pairs can differ from a run without it. Off by default: see docs/differences_from_comlrl.md for the measurement.",
            "group": "Devices and collaboration",
        },
    )
    keep_freed_host_memory: bool = field(
        default=True,
        kw_only=True,
        metadata={
            "help": "Agents on the CPU, Linux (glibc) only: from the first phase on, the process keeps freed blocks below 32 MiB for reuse (malloc's mmap threshold fixed at 32 MiB, its trim threshold at 64 MiB) instead of unmapping them and faulting fresh pages in at the next step, and hands its free pages back when the run ends. Training results are identical either way (see docs/differences_from_comlrl.md for the measurement). Process-wide: once set it stays for the process, and a later run with this off does not undo it. Skipped where malloc is not glibc's or the user chose or tuned it (GLIBC_TUNABLES, any MALLOC_* variable, another allocator in LD_PRELOAD).",
            "group": "Devices and collaboration",
        },
    )
    gc_freeze_during_steps: bool = field(
        default=True,
        kw_only=True,
        metadata={
            "help": "While each step (a phase, its commit and checkpoint) runs, and over the whole of train(), Python's garbage collector leaves alone the objects that existed before it (gc.freeze, undone after), so its full passes walk only what the step made instead of the hundreds of thousands of objects torch and transformers leave: one pass of about 0.3 s in a 7.5 s 32-item tiny-model run. What is computed is identical. Cyclic garbage among the older objects waits for a full pass outside every step (between the workbench's steps, after train()), and a gc.collect() during a step does not reach it. Process-wide while a step runs; CPython 3.10-3.13 with the GIL only (3.14's collector is incremental); skipped where the process has frozen objects itself.",
            "group": "Devices and collaboration",
        },
    )
    cpu_matmul: str = field(
        default="torch",
        kw_only=True,
        metadata={
            "help": "Agents on the CPU, fp32: which kernels run their large linear products (at least 20 M multiply-adds; smaller ones always use torch's BLAS). 'torch' (torch's BLAS, MKL in the PyPI wheels) or 'onednn' (the oneDNN kernels inside the same torch). On an AMD EPYC with AVX-512, MKL keeps its generic kernels, which ran fp32 at under half the CPU's speed, and 'onednn' took a third off SmolLM2-135M's sampling; on an Intel CPU MKL runs its own AVX-512 kernels and 'onednn' is no faster. Measure first (benchmarks/cpu_gemm.py). Agents on GPUs, other dtypes and CPU autocast are unaffected; the agents' nn.Linear layers change class in place (model objects passed in too, and the copies made of them), while comparator, reward and critic models keep torch's BLAS. oneDNN sums in another order: the same maths, other last bits.",
            "choices": ("torch", "onednn"),
            "group": "Devices and collaboration",
        },
    )
    save_total_limit: int | None = field(
        default=None,
        kw_only=True,
        metadata={
            "help": "Keep at most this many checkpoints (checkpoint-NNNNNN folders under the checkpoint dir), deleting the oldest once a newer one is committed; the newest, which a resume uses, is always kept. None keeps all. train(checkpoint_total_limit=N) sets it too.",
            "group": "Training",
        },
    )
    save_in_background: bool = field(
        default=False,
        kw_only=True,
        metadata={
            "help": "Write each checkpoint in a background thread from a copy, so the next phase starts at once; a checkpoint counts only once its write has finished, so a killed run resumes from the one before. Costs one copy of the weights and optimiser state in memory.",
            "group": "Training",
        },
    )
    adamw_implementation: str = field(
        default="fused",
        kw_only=True,
        metadata={
            "help": "How each AdamW step runs: 'fused' (one kernel; 'foreach' where torch has none for the device), 'foreach' (multi-tensor ops) or 'for_loop' (per-tensor loop, CoMLRL's). The same update, rounded in a different order.",
            "choices": ("fused", "foreach", "for_loop"),
            "aliases": {"multi_tensor": "foreach", "loop": "for_loop", "single_tensor": "for_loop"},
            "group": "Training",
        },
    )
    gradient_checkpointing: bool = field(
        default=False,
        kw_only=True,
        metadata={
            "help": "Recompute each agent's activations in its backward pass (DPO and RL updates) to save memory, at about a third more compute.",
            "group": "Large models",
        },
    )

    # Differs from CoMLRL: its oracle is always the reward function; people and a judge model are ours (issue 26).
    preference_source: str = field(
        default="reward",
        kw_only=True,
        metadata={
            "help": "Who decides which of two joint responses is better: the reward function (CoMLRL's oracle), people (a label phase after collect waits for their verdicts, given in the Pairs page or with comlrl-lab labels import) or a judge model asked through an API in both orders.",
            "choices": ("reward", "human", "judge"),
            "choice_help": {
                "reward": "the task's reward function, as CoMLRL",
                "human": "people label blinded comparisons in the Pairs page (A / B / tie / both bad)",
                "judge": "an LLM judge, asked in both orders; kept only when both orders agree",
            },
            "group": "Preference source",
        },
    )
    labels_per_comparison: int = field(
        default=1,
        kw_only=True,
        metadata={
            "help": "human: how many labellers must label each comparison before the round goes on (>= 1); the pair's winner is the side more than half of them prefer, otherwise the comparison is dropped.",
            "group": "Preference source",
            "applies_when": {"preference_source": ("human",)},
        },
    )
    label_guideline: str = field(
        default=DEFAULT_LABEL_GUIDELINE,
        kw_only=True,
        metadata={
            "help": "human: the guideline the labelling view shows above each comparison.",
            "group": "Preference source",
            "applies_when": {"preference_source": ("human",)},
            "multiline": True,
        },
    )
    judge_api_url: str | None = field(
        default=None,
        kw_only=True,
        metadata={
            "help": "judge: endpoint URL of the judge model (required). Credentials in it are never saved; ${ENV_VAR} is read from the environment.",
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
            "strict": True,
            "required": True,
        },
    )
    judge_api_format: str = field(
        default="openai",
        kw_only=True,
        metadata={
            "help": "judge request format, as the api comparator's: generic, openai (chat completions), anthropic (Messages) or openai_responses.",
            "choices": ("generic", "openai", "anthropic", "openai_responses"),
            "aliases": {
                "openai_chat": "openai",
                "chat": "openai",
                "anthropic_messages": "anthropic",
                "messages": "anthropic",
                "responses": "openai_responses",
            },
            "suggest": True,
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
        },
    )
    judge_api_model: str | None = field(
        default=None,
        kw_only=True,
        metadata={
            "help": "judge: 'model' field of each request; also the labeller name of the judge's verdicts ('judge' when empty).",
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
        },
    )
    judge_api_key_env: str | None = field(
        default=None,
        kw_only=True,
        metadata={
            "help": "judge: environment variable holding the API key (None: the format's, OPENAI_API_KEY or ANTHROPIC_API_KEY; empty: no key). The key itself is never a setting, so it is never saved.",
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
            "none_means": "the format's variable",
        },
    )
    judge_template: str = field(
        default=DEFAULT_JUDGE_TEMPLATE,
        kw_only=True,
        metadata={
            "help": "judge: the prompt sent for one comparison; {prompt}, {response_a} and {response_b} are replaced by the item's prompts and the two joint responses (every agent's part). The judge's answer must begin with A, B, tie or both bad.",
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
            "multiline": True,
        },
    )
    judge_max_new_tokens: int = field(
        default=16,
        kw_only=True,
        metadata={
            "help": "judge: most tokens of one answer (>= 1).",
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
        },
    )
    judge_api_timeout: float = field(
        default=60.0,
        kw_only=True,
        metadata={
            "help": "judge: seconds per HTTP request (> 0); a timed-out request is retried.",
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
        },
    )
    judge_api_max_retries: int = field(
        default=3,
        kw_only=True,
        metadata={
            "help": "judge: retries of a request after HTTP 429/5xx or a timeout (>= 0), honouring Retry-After.",
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
        },
    )
    judge_api_max_concurrency: int = field(
        default=8,
        kw_only=True,
        metadata={
            "help": "judge: requests in flight at once (>= 1).",
            "group": "Judge model",
            "applies_when": {"preference_source": ("judge",)},
        },
    )

    def __post_init__(self) -> None:
        if _choose(self, "collaboration_mode") == "centralized":
            # Only the Iter configs have comparator fields; a centralized run has a single actor, index 0.
            index = getattr(self, "comparator_centralized_agent_index", 0)
            if index != 0:
                raise ConfigError(
                    "Centralized collaboration has only actor index 0.",
                    field="comparator_centralized_agent_index",
                    value=index,
                )
            if hasattr(self, "comparator_generation_mode"):
                self.comparator_generation_mode = "centralized"

        self._check_report_to()
        _check_int_at_least("num_train_epochs", self.num_train_epochs, 1)
        _check_int_at_least("num_agents", self.num_agents, 1)
        _check_int_at_least("rollout_buffer_size", self.rollout_buffer_size, 1)
        _check_int_at_least("eval_interval", self.eval_interval, 0)
        _check_int_at_least("eval_num_samples", self.eval_num_samples, 0)
        _check_int_at_least("eval_batch_size", self.eval_batch_size, 1)
        _check_int_at_least("num_turns", self.num_turns, 1)
        _check_int_at_least("logging_steps", self.logging_steps, 1)

        if self.train_batch_size is None:
            self.train_batch_size = self.rollout_buffer_size
        _check_int_at_least("train_batch_size", self.train_batch_size, 1)

        if _choose(self, "parallel_training") == "mp" and self.agent_devices is None:
            raise ConfigError(
                "parallel_training='mp' requires explicit agent_devices.",
                field="parallel_training",
                value=self.parallel_training,
            )

        if not _is_number(self.reference_kl_coef) or self.reference_kl_coef < 0:
            raise ConfigError(
                "reference_kl_coef must be >= 0.", field="reference_kl_coef", value=self.reference_kl_coef
            )
        if self.reference_kl_enabled and self.reference_devices is not None:
            self._check_device_list("reference_devices", self.reference_devices)

        if self.num_turns != 1:
            raise ConfigError("MADPO currently supports num_turns=1 only.", field="num_turns", value=self.num_turns)

        _check_int_at_least("preference_num_candidates", self.preference_num_candidates, 2)
        if self.preference_pairs_per_sample is not None and (
            not _is_int(self.preference_pairs_per_sample) or self.preference_pairs_per_sample < 1
        ):
            raise ConfigError(
                "preference_pairs_per_sample must be >= 1 or null.",
                field="preference_pairs_per_sample",
                value=self.preference_pairs_per_sample,
            )

        _check_positive("dpo_beta", self.dpo_beta)
        _choose(self, "madpo_reference")
        if not isinstance(self.madpo_length_normalize, bool):
            raise ConfigError(
                f"madpo_length_normalize must be true or false, got {self.madpo_length_normalize!r}.",
                field="madpo_length_normalize",
                value=self.madpo_length_normalize,
            )
        if not _is_number(self.madpo_nll_weight) or self.madpo_nll_weight < 0 or math.isinf(self.madpo_nll_weight):
            raise ConfigError(
                "madpo_nll_weight must be a finite number >= 0.", field="madpo_nll_weight", value=self.madpo_nll_weight
            )
        _check_int_at_least("environment_steps_per_pair", self.environment_steps_per_pair, 1)

        selection = _choose(self, "pair_selection")
        if selection == "all" and self.preference_pairs_per_sample is not None:
            raise ConfigError(
                "preference_pairs_per_sample must be null when pair_selection='all'.",
                field="preference_pairs_per_sample",
                value=self.preference_pairs_per_sample,
            )

        # Differs from CoMLRL: these fail here, by name, not after the models have loaded (or never).
        if str(self.joint_mode).strip().lower() not in ("aligned", "align"):
            family = type(self).__name__.removesuffix("Config")
            raise ConfigError(
                f"{family} preference generation currently supports aligned joint_mode only.",
                field="joint_mode",
                value=self.joint_mode,
            )
        _check_int_at_least("max_new_tokens", self.max_new_tokens, 1)
        _check_positive("temperature", self.temperature)
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}.", field="top_p", value=self.top_p)
        _check_int_at_least("top_k", self.top_k, 0, optional=True)
        if not _is_number(self.agent_learning_rate) or self.agent_learning_rate < 0:
            raise ConfigError(
                f"agent_learning_rate must be a number >= 0, got {self.agent_learning_rate!r}.",
                field="agent_learning_rate",
                value=self.agent_learning_rate,
            )

        # Our fields, checked after CoMLRL's so a CoMLRL config fails with CoMLRL's message first.
        _check_int_at_least("seed", self.seed, 0)
        _check_int_at_least("eval_samples_per_item", self.eval_samples_per_item, 1)
        _check_int_at_least("generation_batch_size", self.generation_batch_size, 1, optional=True)
        _check_int_at_least("scoring_batch_size", self.scoring_batch_size, 1)
        _check_positive("max_grad_norm", self.max_grad_norm, optional=True)
        _choose(self, "adamw_implementation")
        _choose(self, "cpu_matmul")
        _choose(self, "save_strategy")
        _choose(self, "use_chat_template")
        _check_int_at_least("save_total_limit", self.save_total_limit, 1, optional=True)
        _check_int_at_least("lora_r", self.lora_r, 1, optional=True)
        _check_positive("lora_alpha", self.lora_alpha)
        if not _is_number(self.lora_dropout) or not 0 <= self.lora_dropout < 1:
            raise ConfigError(
                f"lora_dropout must be in [0, 1), got {self.lora_dropout!r}.",
                field="lora_dropout",
                value=self.lora_dropout,
            )
        targets = self.lora_target_modules
        if targets is not None and not (
            (isinstance(targets, str) and targets.strip())
            or (
                isinstance(targets, (list, tuple))
                and targets
                and all(isinstance(t, str) and t.strip() for t in targets)
            )
        ):
            raise ConfigError(
                f"lora_target_modules must be None, a module name or a non-empty list of module names, got {targets!r}.",
                field="lora_target_modules",
                value=targets,
            )
        self._check_preference_source()

    def _check_preference_source(self) -> None:
        """``preference_source`` and the label and judge settings it brings."""
        _choose(self, "preference_source")
        _check_int_at_least("labels_per_comparison", self.labels_per_comparison, 1)
        if not isinstance(self.label_guideline, str):
            raise ConfigError("label_guideline must be a string.", field="label_guideline", value=self.label_guideline)
        _check_dependent(self, "judge_api_url", "preference_source")
        _choose(self, "judge_api_format")
        if not isinstance(self.judge_template, str):
            raise ConfigError("judge_template must be a string.", field="judge_template", value=self.judge_template)
        missing = [p for p in JUDGE_PLACEHOLDERS if p not in self.judge_template]
        if missing and self.preference_source == "judge":
            raise ConfigError(
                f"judge_template must contain {', '.join(missing)}: the judge would not see what it compares.",
                field="judge_template",
            )
        _check_int_at_least("judge_max_new_tokens", self.judge_max_new_tokens, 1)
        _check_positive("judge_api_timeout", self.judge_api_timeout)
        _check_int_at_least("judge_api_max_retries", self.judge_api_max_retries, 0)
        _check_int_at_least("judge_api_max_concurrency", self.judge_api_max_concurrency, 1)

    def _check_report_to(self) -> None:
        """``report_to`` as a list of known tracker names (a single name is accepted); "none" stands alone."""
        value = self.report_to
        if value is None:
            return
        names = [value] if isinstance(value, str) else value
        allowed = field_multi_choices(type(self), "report_to")
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise ConfigError(
                f"report_to must be a list of tracker names ({', '.join(allowed)}), got {value!r}.",
                field="report_to",
                value=value,
            )
        cleaned = list(dict.fromkeys(_clean(n) for n in names))
        unknown = [n for n in cleaned if n not in allowed]
        if unknown:
            raise ConfigError(
                f"report_to entries must be one of: {', '.join(allowed)}; got {unknown[0]!r}.",
                field="report_to",
                value=value,
            )
        if "none" in cleaned and len(cleaned) > 1:
            raise ConfigError(
                "report_to: 'none' cannot be combined with other trackers.", field="report_to", value=value
            )
        self.report_to = cleaned

    def _check_device_list(self, name: str, spec: Any) -> None:
        """Shape check of a device spec without torch: a string, or a list of 1 or actor-count entries."""
        actor_count = 1 if self.collaboration_mode == "centralized" else self.num_agents
        if isinstance(spec, str):
            return
        if not isinstance(spec, (list, tuple)) or not all(isinstance(d, (str, int)) for d in spec):
            raise ConfigError(
                f"{name} must be a device string or a list of device strings, got {spec!r}.", field=name, value=spec
            )
        if len(spec) not in (1, actor_count):
            raise ConfigError(f"{name} length ({len(spec)}) must be 1 or {actor_count}.", field=name, value=spec)

    # ---- serialisation: the API key never leaves memory -------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe field values; ``comparator_api_key`` is left out, header values and URL credentials masked.

        Use this, not ``dataclasses.asdict``, which copies the key. Model objects in ``comparator_agents``
        are written as the id they were loaded from.
        """
        values = credentials.public_config({f.name: getattr(self, f.name) for f in fields(self)})
        return {name: _jsonable(value, name, name) for name, value in values.items() if name not in SECRET_FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MADPOConfig:
        """Build and validate a config from ``to_dict`` output (or any subset); unknown keys are an error."""
        check_field_names(cls, data)
        return cls(**data)

    @classmethod
    def field_help(cls) -> dict[str, str]:
        """Field name -> help text, in declaration order: the one text for UI tooltips, CLI help and docs."""
        return {f.name: f.metadata["help"] for f in fields(cls)}

    def __repr__(self) -> str:
        shown = credentials.public_config({f.name: getattr(self, f.name) for f in fields(self)})
        parts = []
        for f in fields(self):
            value = MASK if f.name in SECRET_FIELDS and getattr(self, f.name) else shown.get(f.name)
            parts.append(f"{f.name}={value!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def __getstate__(self) -> dict[str, Any]:
        # Differs from CoMLRL, which saved the key into checkpoint configs: pickles (torch.save, multiprocessing)
        # drop it, and a restored config reads comparator_api_key_env again.
        state = dict(self.__dict__)
        for name in SECRET_FIELDS & state.keys():
            state[name] = None
        public = credentials.public_config(state)
        for name in (credentials.HEADERS_FIELD, credentials.URL_FIELD):
            if name in state:
                state[name] = public[name]
        return state

    def __copy__(self) -> MADPOConfig:
        # copy and deepcopy stay in memory, so they keep the key that __getstate__ would drop.
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> MADPOConfig:
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            new.__dict__[name] = copy.deepcopy(value, memo)
        return new


@dataclass(repr=False)
class MARLHFConfig(MADPOConfig):
    """Config of ``MARLHFTrainer``: a Bradley-Terry reward model, then online multi-agent RL against it."""

    rl_algorithm: str = field(
        default="magrpo",
        metadata={
            "help": "Policy-learning algorithm: magrpo (group-mean baseline), mareinforce (alias mareforce; raw reward), maremax (group max), marloo (leave-one-out), maac (central critic) or iac (independent critics).",
            "choices": ("magrpo", "mareinforce", "maremax", "marloo", "maac", "iac"),
            "aliases": {"mareforce": "mareinforce"},
            "group": "Policy learning (MARLHF)",
        },
    )
    num_generations: int = field(
        default=4,
        metadata={
            "help": "G: samples per prompt in online RL (>= 2 for the MAGRPO family, >= 1 for maac/iac).",
            "group": "Policy learning (MARLHF)",
        },
    )
    reward_model_name: str | None = field(
        default=None,
        metadata={
            "help": "Hugging Face id or path of the reward-model backbone; None uses the agents' model id (required when agents are model objects).",
            "group": "Reward model (MARLHF)",
        },
    )
    # Differs from CoMLRL: its default is "cuda:0", which fails on CPU-only hosts.
    reward_model_device: str | None = field(
        default=None,
        metadata={
            "help": "Device of the reward model; None follows the first agent device (CoMLRL defaults to 'cuda:0').",
            "group": "Reward model (MARLHF)",
        },
    )
    reward_learning_rate: float = field(
        default=1e-5,
        metadata={"help": "AdamW learning rate of the reward model (> 0).", "group": "Reward model (MARLHF)"},
    )
    reward_num_train_epochs: int = field(
        default=1, metadata={"help": "Bradley-Terry training epochs over the pairs.", "group": "Reward model (MARLHF)"}
    )
    reward_train_batch_size: int = field(
        default=1, metadata={"help": "Pairs per Bradley-Terry optimiser step.", "group": "Reward model (MARLHF)"}
    )
    reward_max_length: int | None = field(
        default=None,
        metadata={
            "help": "Token truncation length of reward-model inputs; None = the tokenizer's model maximum.",
            "group": "Reward model (MARLHF)",
        },
    )
    reward_freeze_backbone: bool = field(
        default=False, metadata={"help": "Train only the reward model's scalar head.", "group": "Reward model (MARLHF)"}
    )
    critic_model_name: str | None = field(
        default=None,
        metadata={
            "help": "Critic backbone for maac/iac; None uses the agents' model id (required when agents are model objects).",
            "group": "Policy learning (MARLHF)",
        },
    )
    critic_learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "Critic learning rate (> 0); None = agent_learning_rate.",
            "group": "Policy learning (MARLHF)",
        },
    )
    critic_devices: str | list[str] | None = field(
        default=None,
        metadata={
            "help": "Critic devices for maac/iac; None = automatic (agent_devices with parallel_training='mp').",
            "group": "Policy learning (MARLHF)",
            "none_means": "automatic",
        },
    )
    use_separate_critic: bool = field(
        default=True,
        metadata={
            "help": "iac: separate critic models (True) or value heads on the actors (False).",
            "group": "Policy learning (MARLHF)",
        },
    )
    critic_type: str = field(
        default="v",
        metadata={
            "help": "'v' = V(prompt) or 'q' = Q(prompt + response).",
            "choices": ("v", "q"),
            "group": "Policy learning (MARLHF)",
        },
    )
    value_loss_coef: float = field(
        default=0.6, metadata={"help": "Weight of the critic loss (> 0).", "group": "Policy learning (MARLHF)"}
    )
    value_clip_range: float | None = field(
        default=0.2,
        metadata={
            "help": "iac value clipping range (> 0), used without a separate critic; None disables.",
            "group": "Policy learning (MARLHF)",
        },
    )
    critic_value_head_hidden_dim: int | None = field(
        default=None,
        metadata={
            "help": "Hidden width of the iac critic's value head; None = a linear head.",
            "group": "Policy learning (MARLHF)",
        },
    )
    value_head_hidden_dim: int | None = field(
        default=None,
        metadata={
            "help": "Hidden width of the value head on iac actors; None = a linear head.",
            "group": "Policy learning (MARLHF)",
        },
    )
    # Differs from CoMLRL: it reports nothing about Bradley-Terry fitting.
    bt_validation_fraction: float = field(
        default=0.1,
        kw_only=True,
        metadata={
            "help": "Share of preference pairs held out from Bradley-Terry fitting to report its validation loss and accuracy, in [0, 0.5). 0 fits on every pair.",
            "group": "Reward model (MARLHF)",
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        algorithm = _choose(self, "rl_algorithm")
        if algorithm in MAGRPO_FAMILY_ADVANTAGE_MODE:
            if not _is_int(self.num_generations) or self.num_generations < 2:
                raise ConfigError(
                    "num_generations must be >= 2 for MAGRPO-family MARLHF backends.",
                    field="num_generations",
                    value=self.num_generations,
                )
        else:
            _check_int_at_least("num_generations", self.num_generations, 1)
        _check_positive("reward_learning_rate", self.reward_learning_rate)
        _check_int_at_least("reward_num_train_epochs", self.reward_num_train_epochs, 1)
        _check_int_at_least("reward_train_batch_size", self.reward_train_batch_size, 1)
        _check_int_at_least("reward_max_length", self.reward_max_length, 1, optional=True, says_null=True)
        _check_positive("critic_learning_rate", self.critic_learning_rate, optional=True)
        _choose(self, "critic_type")
        _check_positive("value_loss_coef", self.value_loss_coef)
        _check_positive("value_clip_range", self.value_clip_range, optional=True)
        if not _is_number(self.bt_validation_fraction) or not 0 <= self.bt_validation_fraction < 0.5:
            raise ConfigError(
                "bt_validation_fraction must be in [0, 0.5).",
                field="bt_validation_fraction",
                value=self.bt_validation_fraction,
            )
        if algorithm in MAGRPO_FAMILY_ADVANTAGE_MODE:
            self.advantage_mode = MAGRPO_FAMILY_ADVANTAGE_MODE[algorithm]


@dataclass(repr=False)
class _IterativePreferenceConfig:
    """Comparator and replay-buffer fields shared by MADPOIterConfig and MARLHFIterConfig.

    Listed first among the bases, so its ``__post_init__`` runs the base config's checks before its own.
    """

    num_iterations: int = field(
        default=6, metadata={"help": "Rounds of collect -> replay sample -> train.", "group": "Essentials"}
    )
    # Defaults both iterative configs override (CoMLRL's values); declared here once.
    preference_num_candidates: int = field(
        default=20, metadata={"help": "N: candidates sampled per agent per prompt (>= 2).", "group": "Essentials"}
    )
    preference_pairs_per_sample: int | None = field(
        default=4,
        metadata={
            "help": "Cap on pairs kept per task item; None keeps all (required with pair_selection='all').",
            "group": "Preference pairs",
        },
    )
    pair_selection: str = field(
        default="comparator_reward",
        metadata={
            "help": "Which current-vs-comparator pairs to keep: 'comparator_reward', 'reward_gap', 'all' or 'random'.",
            "choices": ("reward_gap", "all", "random", "comparator_reward"),
            "group": "Preference pairs",
        },
    )
    preference_replay_mode: str = field(
        default="current",
        metadata={
            "help": "Training set per round: current (this round's pairs; aliases latest, new), nearest_k (the k most recent non-empty rounds; recent_k, last_k, k), all_history, or lambda_decay (weight (1-l)l^a/(1-l^K) for age a; lambda, td_lambda).",
            "choices": ("current", "nearest_k", "all_history", "lambda_decay"),
            "aliases": {
                "latest": "current",
                "new": "current",
                "recent_k": "nearest_k",
                "last_k": "nearest_k",
                "k": "nearest_k",
                "lambda": "lambda_decay",
                "td_lambda": "lambda_decay",
                "td-lambda": "lambda_decay",
            },
            "choice_help": {
                "current": "Train on this round's pairs only.",
                "nearest_k": "Draw from the k most recent non-empty round datasets, equal weights.",
                "all_history": "Draw from every non-empty round dataset, equal weights.",
                "lambda_decay": "Draw from every round dataset with weight (1-λ)λ^age / (1-λ^K); newest has age 0.",
            },
            "group": "Replay buffer",
        },
    )
    preference_replay_k: int | None = field(
        default=None,
        metadata={
            "help": "nearest_k: number of most recent non-empty round datasets (required, >= 1). current accepts only None or 1.",
            "group": "Replay buffer",
            "applies_when": {"preference_replay_mode": ("nearest_k",)},
            "symbol": "k",
            "strict": True,
            "required": True,
            # CoMLRL lets k = 1 through under 'current' (one round is what current uses anyway).
            "tolerated": {"current": 1},
            "suggested": 2,
        },
    )
    preference_replay_lambda: float | None = field(
        default=None,
        metadata={
            "help": "lambda_decay: lambda in [0, 1] (required); 0 keeps the newest round only, 1 weights all equally.",
            "group": "Replay buffer",
            "applies_when": {"preference_replay_mode": ("lambda_decay",)},
            "symbol": "λ",
            "strict": True,
            "required": True,
            "suggested": 0.5,
        },
    )
    preference_replay_sample_size: int | None = field(
        default=None,
        metadata={
            "help": "Pairs drawn per round in nearest_k, all_history and lambda_decay (>= 1); None = this round's pair count, or the latest non-empty dataset's size.",
            "group": "Replay buffer",
            "applies_when": {"preference_replay_mode": ("nearest_k", "all_history", "lambda_decay")},
            "strict": True,
            "none_means": "this round's pair count",
        },
    )
    preference_replay_dir: str | None = field(
        default=None,
        metadata={
            "help": "Directory of the iteration_NNNN.json round files; None = <output_dir>/preference_replay.",
            "group": "Replay buffer",
        },
    )
    log_reward_distribution: bool = field(
        default=False,
        metadata={
            "help": "Log each round's candidate and selected raw-reward histograms (16 bins over reward_func.reward_range, which must be declared): <output_dir>/reward_distributions/iteration_NNNN.json, the store and the Learning page.",
            "group": "Preference pairs",
        },
    )
    policy_checkpoint_dir: str | None = field(
        default=None,
        metadata={
            "help": "Where to save the policies at the start and after every round; set automatically for the history comparator.",
            "group": "Comparator",
        },
    )
    comparator_policy: str = field(
        default="current",
        metadata={
            "help": "Opponent of the current agents: current (live weights, own RNG stream), current_copy (a copy on comparator_devices), model (comparator_model_name or comparator_agents), history (checkpoint comparator_history_k rounds back) or api (remote endpoint).",
            "choices": ("current", "current_copy", "model", "history", "api"),
            "aliases": {
                "self": "current",
                "online": "current",
                "copy": "current_copy",
                "online_copy": "current_copy",
                "current-offload": "current_copy",
                "current_offload": "current_copy",
                "external": "model",
                "comparator": "model",
                "reference": "model",
                "ref": "model",
                "checkpoint": "history",
                "previous": "history",
                "previous_iteration": "history",
                "http": "api",
                "endpoint": "api",
            },
            "choice_help": {
                "current": "The current agents themselves, sampled with a separate random stream.",
                "current_copy": "A copy of the current weights on comparator_devices, refreshed each collection phase.",
                "model": "A fixed model: comparator_model_name for every agent, or one per agent in comparator_agents.",
                "history": "The agents as they were comparator_history_k rounds back (checkpoints are saved automatically).",
                "api": "A remote endpoint. The key is read from the environment variable named in comparator_api_key_env; it is never typed here or saved.",
            },
            "group": "Comparator",
        },
    )
    comparator_generation_mode: str = field(
        default="decentralized",
        metadata={
            "help": "'decentralized' (one comparator per agent) or 'centralized' (one comparator model writes all roles in one joint response). Forced to centralized by centralized collaboration.",
            "choices": ("decentralized", "centralized"),
            "aliases": {
                "decentralised": "decentralized",
                "multi_agent": "decentralized",
                "multi-agent": "decentralized",
                "centralised": "centralized",
                "single_agent": "centralized",
                "single-agent": "centralized",
            },
            "group": "Comparator",
        },
    )
    comparator_centralized_agent_index: int = field(
        default=0,
        metadata={
            "help": "Centralized comparator: index of the agent whose model (and tokenizer) writes the joint response.",
            "group": "Comparator",
            "applies_when": {"comparator_generation_mode": ("centralized",)},
        },
    )
    comparator_model_name: str | None = field(
        default=None,
        metadata={
            "help": "model comparator: Hugging Face id or path used for every agent.",
            "group": "Comparator",
            "applies_when": {"comparator_policy": ("model",)},
        },
    )
    comparator_agents: list[Any] | None = field(
        default=None,
        metadata={
            "help": "model comparator: one id/path or model object per agent.",
            "group": "Comparator",
            "applies_when": {"comparator_policy": ("model",)},
        },
    )
    comparator_devices: str | list[str] | None = field(
        default=None,
        metadata={
            "help": "Comparator devices: None (agent_devices, else auto), one device, or a list.",
            "group": "Comparator",
            "applies_when": {"comparator_policy": ("current_copy", "model", "history")},
            "none_means": "the agent devices",
        },
    )
    comparator_num_candidates: int | None = field(
        default=None,
        metadata={
            "help": "M: comparator candidates per agent per prompt (>= 1); None = preference_num_candidates.",
            "group": "Comparator",
        },
    )
    comparator_history_k: int | None = field(
        default=None,
        metadata={
            "help": "history comparator: rounds back (>= 1; None -> 1, which equals the current policy).",
            "group": "Comparator",
            "applies_when": {"comparator_policy": ("history",)},
            "none_means": "1 round back",
        },
    )
    comparator_api_url: str | None = field(
        default=None,
        metadata={
            "help": "api comparator: endpoint URL (required). Userinfo and key-like query values are never saved; ${ENV_VAR} is read from the environment.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_format: str = field(
        default="generic",
        metadata={
            "help": "api comparator request format: generic, openai (openai_chat, chat), anthropic (anthropic_messages, messages) or openai_responses (responses, codex). Other names are an error that suggests the closest one.",
            "choices": ("generic", "openai", "anthropic", "openai_responses"),
            "aliases": {
                "openai_chat": "openai",
                "chat": "openai",
                "anthropic_messages": "anthropic",
                "messages": "anthropic",
                "responses": "openai_responses",
                "codex": "openai_responses",
            },
            # Differs from CoMLRL: it sends any other name as the generic format; a typo here would send requests
            # the endpoint rejects, so an unknown name is an error with a did-you-mean hint.
            "suggest": True,
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_model: str | None = field(
        default=None,
        metadata={
            "help": "api comparator: 'model' field of each request.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_max_n_per_request: int | None = field(
        default=None,
        metadata={
            "help": "openai format: cap on n per request (>= 1); None = all candidates at once (1 for DeepSeek).",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_timeout: float = field(
        default=120.0,
        metadata={
            "help": "api comparator: seconds per HTTP request (> 0).",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_headers: dict[str, str] | None = field(
        default=None,
        metadata={
            "help": "api comparator: extra HTTP headers. Values are never saved (written as ***) unless given as ${ENV_VAR}, which is read from the environment.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_key: str | None = field(
        default=None,
        metadata={
            "help": "api comparator: literal key, kept in memory only (never saved, unlike CoMLRL). Prefer comparator_api_key_env.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_key_env: str | None = field(
        default=None,
        metadata={
            "help": "api comparator: environment variable holding the key, read when comparator_api_key is empty.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_key_header: str = field(
        default="Authorization",
        metadata={
            "help": "api comparator: header that carries the key.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_key_prefix: str = field(
        default="Bearer",
        metadata={
            "help": "api comparator: prefix joined to the key with one space; empty sends the key alone.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_response_field: str = field(
        default="completions",
        metadata={
            "help": "generic format: dotted path of the completions in the response JSON.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_extra_body: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "api comparator: merged last into every request body (overrides).",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    # Differs from CoMLRL: it sends requests one at a time and never retries.
    comparator_api_max_concurrency: int = field(
        default=8,
        kw_only=True,
        metadata={
            "help": "api comparator: requests in flight at once (>= 1). CoMLRL sends one at a time.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_max_retries: int = field(
        default=3,
        kw_only=True,
        metadata={
            "help": "api comparator: retries of a request after HTTP 429/5xx or a timeout (>= 0). CoMLRL never retries.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_backoff_base: float = field(
        default=0.5,
        kw_only=True,
        metadata={
            "help": "api comparator: first retry delay in seconds, doubled on each retry (> 0).",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_backoff_max: float = field(
        default=60.0,
        kw_only=True,
        metadata={
            "help": "api comparator: longest delay in seconds between two retries of our own backoff (> 0).",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_retry_after_max: float = field(
        default=60.0,
        kw_only=True,
        metadata={
            "help": "api comparator: longest Retry-After wait in seconds the server may ask for (> 0); a longer one fails the request at once, naming this cap.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )
    comparator_api_max_response_bytes: int = field(
        default=16 * 1024 * 1024,
        kw_only=True,
        metadata={
            "help": "api comparator: largest response body in bytes (>= 1, default 16 MiB); a larger one fails the request as soon as it passes the bound, before the rest is read. CoMLRL reads any size.",
            "group": "API comparator",
            "applies_when": _API_ONLY,
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # type: ignore[misc]  # MADPOConfig or MARLHFConfig, next in the MRO
        _check_int_at_least("num_iterations", self.num_iterations, 1)
        self._check_replay()

        mode = _choose(self, "comparator_generation_mode")
        if mode == "centralized":
            index = self.comparator_centralized_agent_index
            if not _is_int(index) or not 0 <= index < self.num_agents:  # type: ignore[attr-defined]
                raise ConfigError(
                    f"comparator_centralized_agent_index must be in [0, {self.num_agents}).",  # type: ignore[attr-defined]
                    field="comparator_centralized_agent_index",
                    value=index,
                )

        _check_int_at_least(
            "comparator_num_candidates", self.comparator_num_candidates, 1, optional=True, says_null=True
        )
        _check_int_at_least("comparator_api_max_n_per_request", self.comparator_api_max_n_per_request, 1, optional=True)
        self._check_comparator_policy()

        # Differs from CoMLRL: the format is resolved here, once (an unknown name is an error), not at every request.
        _choose(self, "comparator_api_format")
        # Differs from CoMLRL: the timeout is checked here, not left to fail inside the HTTP client.
        _check_positive("comparator_api_timeout", self.comparator_api_timeout)
        _check_int_at_least("comparator_api_max_concurrency", self.comparator_api_max_concurrency, 1)
        _check_int_at_least("comparator_api_max_retries", self.comparator_api_max_retries, 0)
        _check_positive("comparator_api_backoff_base", self.comparator_api_backoff_base)
        _check_positive("comparator_api_backoff_max", self.comparator_api_backoff_max)
        _check_positive("comparator_api_retry_after_max", self.comparator_api_retry_after_max)
        _check_int_at_least("comparator_api_max_response_bytes", self.comparator_api_max_response_bytes, 1)
        url = self.comparator_api_url
        if url:
            parts = urlsplit(url) if isinstance(url, str) else None
            if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
                # The URL may hold a credential: name its scheme, never the URL itself.
                scheme = parts.scheme if parts is not None else type(url).__name__
                raise ConfigError(
                    f"comparator_api_url must be an http(s) URL with a host, got scheme {scheme!r}.",
                    field="comparator_api_url",
                )

    def _check_replay(self) -> None:
        _choose(self, "preference_replay_mode")
        # CoMLRL's order: each field's place under the mode, then its value, field by field.
        for name in dependents(type(self), "preference_replay_mode"):
            if not _check_dependent(self, name, "preference_replay_mode"):
                continue
            value = getattr(self, name)
            if name == "preference_replay_lambda":
                if not _is_number(value) or not 0 <= value <= 1:
                    raise ConfigError("preference_replay_lambda must be in [0, 1].", field=name, value=value)
            else:
                _check_int_at_least(name, value, 1)

    def _check_comparator_policy(self) -> None:
        policy = _choose(self, "comparator_policy")
        has_model = self.comparator_model_name is not None or self.comparator_agents is not None
        model_only = "comparator_model_name and comparator_agents are only valid when comparator_policy='model'."
        history_only = "comparator_history_k is only valid when comparator_policy='history'."

        if policy == "model":
            if not has_model:
                raise ConfigError(
                    "comparator_model_name or comparator_agents is required when comparator_policy='model'.",
                    field="comparator_model_name",
                )
            if self.comparator_history_k is not None:
                raise ConfigError(history_only, field="comparator_history_k", value=self.comparator_history_k)
            return
        if policy == "history":
            if self.comparator_history_k is None:
                self.comparator_history_k = 1
            _check_int_at_least("comparator_history_k", self.comparator_history_k, 1)
        elif self.comparator_history_k is not None:
            raise ConfigError(history_only, field="comparator_history_k", value=self.comparator_history_k)
        # CoMLRL lets the api comparator carry model fields it never uses; only current/copy/history reject them.
        if policy != "api" and has_model:
            name = "comparator_model_name" if self.comparator_model_name is not None else "comparator_agents"
            raise ConfigError(model_only, field=name, value=getattr(self, name))
        if policy == "api" and not self.comparator_api_url:
            raise ConfigError(
                "comparator_api_url is required when comparator_policy='api'.", field="comparator_api_url"
            )


@dataclass(repr=False)
class MADPOIterConfig(_IterativePreferenceConfig, MADPOConfig):
    """Config of ``MADPOIterTrainer``: MADPO repeated for num_iterations rounds against a comparator."""

    num_train_epochs: int = field(
        default=1, metadata={"help": "DPO passes over each round's training set.", "group": "Essentials"}
    )


@dataclass(repr=False)
class MARLHFIterConfig(_IterativePreferenceConfig, MARLHFConfig):
    """Config of ``MARLHFIterTrainer``: each round fits a fresh reward model, then learns the policies."""

    num_train_epochs: int = field(default=2, metadata={"help": "Online-RL epochs per round.", "group": "Essentials"})
    reward_num_train_epochs: int = field(
        default=2, metadata={"help": "Bradley-Terry training epochs per round.", "group": "Reward model (MARLHF)"}
    )
    preference_scoring_reward: str = field(
        default="task",
        metadata={
            "help": "Oracle for new comparisons: 'task' (reward_func; aliases oracle, environment, env) or 'reward_model' (the latest fitted reward model, task reward until one exists; aliases model, learned).",
            "choices": ("task", "reward_model"),
            "aliases": {
                "oracle": "task",
                "environment": "task",
                "env": "task",
                "model": "reward_model",
                "learned": "reward_model",
            },
            "group": "Preference pairs",
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        _choose(self, "preference_scoring_reward")


CONFIG_CLASSES: dict[str, type[MADPOConfig]] = {
    "MADPO": MADPOConfig,
    "MARLHF": MARLHFConfig,
    "MADPOIter": MADPOIterConfig,
    "MARLHFIter": MARLHFIterConfig,
}
