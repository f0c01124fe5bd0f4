"""The four preference-trainer configs: CoMLRL 1.4.3's fields, defaults, aliases and validation messages.

``MADPOConfig`` holds everything the trainers share, ``MARLHFConfig`` adds reward-model and online-RL
fields, and ``_IterativePreferenceConfig`` adds the comparator and replay-buffer fields of the two Iter
configs. Every field carries ``metadata["help"]``, the one text shown as UI tooltip, CLI help and docs, and
``metadata["group"]``, the section the Setup form and the docs put it in. A field that takes one of a few names
also carries ``"choices"`` (the canonical values), ``"aliases"`` (other spelling -> canonical value) and, where
an unknown name gets a "did you mean" hint instead of CoMLRL's "must be one of" message, ``"suggest": True``. These
are the only lists of allowed values: validation, the API client, the Setup form and docs/config_reference.md all
read them (``field_choices``, ``field_aliases``, ``resolve_choice``, ``check_choice``). All validation and alias normalisation happens in
``__post_init__`` and raises ``ValueError``. Three keys serve the Setup form only: ``"applies_when"`` (controlling
field -> the values under which the field means anything; elsewhere the form hides it and leaves it out),
``"suggested"`` (what the form fills in when the field becomes required) and ``"none_means"`` (what None stands for).

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
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

from comlrl_lab.data import credentials

__all__ = [
    "CONFIG_CLASSES",
    "MADPOConfig",
    "MADPOIterConfig",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "SECRET_FIELDS",
    "check_choice",
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

SECRET_FIELDS: frozenset[str] = frozenset({"comparator_api_key"})
MASK = credentials.MASK


def _clean(value: Any) -> str:
    return "" if value is None else str(value).strip().lower()


def field_choices(config_class: type, name: str) -> tuple[str, ...]:
    """The canonical values of field ``name`` in ``config_class`` (``metadata["choices"]``); () for a free field."""
    return tuple(config_class.__dataclass_fields__[name].metadata.get("choices", ()))


def field_aliases(config_class: type, name: str) -> dict[str, str]:
    """Alias -> canonical value of field ``name`` (``metadata["aliases"]``); the canonical names are not repeated."""
    return dict(config_class.__dataclass_fields__[name].metadata.get("aliases", {}))


def field_multi_choices(config_class: type, name: str) -> tuple[str, ...]:
    """The values a list field such as ``report_to`` may hold (``metadata["multi_choices"]``); () for others."""
    return tuple(config_class.__dataclass_fields__[name].metadata.get("multi_choices", ()))


def resolve_choice(config_class: type, name: str, value: Any) -> str | None:
    """The canonical value ``value`` spells (lower-cased and trimmed; an alias counts), else None."""
    metadata = config_class.__dataclass_fields__[name].metadata
    key = _clean(value)
    if key in metadata["choices"]:
        return key
    return metadata.get("aliases", {}).get(key)


def check_choice(config_class: type, name: str, value: Any) -> str:
    """The canonical value ``value`` spells, or a ``ValueError``: CoMLRL's "must be one of" message, or for a field
    marked ``"suggest"`` one that lists the accepted names and aliases and suggests the closest spelling."""
    canonical = resolve_choice(config_class, name, value)
    if canonical is not None:
        return canonical
    choices = field_choices(config_class, name)
    if not config_class.__dataclass_fields__[name].metadata.get("suggest"):
        raise ValueError(f"{name} must be one of: {', '.join(choices)}.")
    aliases = field_aliases(config_class, name)
    close = difflib.get_close_matches(_clean(value), [*choices, *aliases], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "."
    raise ValueError(f"{name} {value!r} is not one of: {', '.join(choices)} (aliases: {', '.join(aliases)}){hint}")


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
        raise ValueError(f"{name} must be an integer, got {value!r}.")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}{' or null' if says_null else ''}.")


def _check_positive(name: str, value: Any, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not _is_number(value) or not value > 0:
        raise ValueError(f"{name} must be > 0.")


def _jsonable(value: Any, path: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(item, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, f"{path}[{k!r}]") for k, v in value.items()}
    # comparator_agents may hold model objects: keep the id they were loaded from, which loads them again.
    name = getattr(value, "name_or_path", None) or getattr(getattr(value, "config", None), "_name_or_path", None)
    if isinstance(name, str) and name:
        return name
    raise ValueError(f"{path} holds a {type(value).__name__} without a model id, so the config cannot be serialised.")


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
            "group": "Devices and collaboration",
        },
    )
    parallel_training: str = field(
        default="none",
        metadata={
            "help": "'none' or 'mp' (one worker thread per agent when agents sit on different devices; needs agent_devices). 'null' means none.",
            "choices": ("none", "mp"),
            "aliases": {"null": "none", "": "none"},
            "group": "Devices and collaboration",
        },
    )
    agent_devices: str | list[str] | None = field(
        default=None,
        metadata={
            "help": "Agent devices: None or 'auto' (cuda:i per agent if enough GPUs, else cuda:0, else cpu), one device for all, or a list of 1 or num_agents devices.",
            "group": "Devices and collaboration",
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
    generation_batch_size: int = field(
        default=64,
        kw_only=True,
        metadata={"help": "Sequences per generate call when sampling candidates (>= 1).", "group": "Generation"},
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

    def __post_init__(self) -> None:
        modes = field_choices(type(self), "collaboration_mode")
        if self.collaboration_mode not in modes:
            raise ValueError(f"collaboration_mode must be {' or '.join(modes)}.")
        if self.collaboration_mode == "centralized":
            # Only the Iter configs have comparator fields; a centralized run has a single actor, index 0.
            if getattr(self, "comparator_centralized_agent_index", 0) != 0:
                raise ValueError("Centralized collaboration has only actor index 0.")
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

        parallel = resolve_choice(type(self), "parallel_training", self.parallel_training)
        if parallel is None:
            raise ValueError(
                f"parallel_training only supports: {', '.join(field_choices(type(self), 'parallel_training'))}."
            )
        self.parallel_training = parallel
        if parallel == "mp" and self.agent_devices is None:
            raise ValueError("parallel_training='mp' requires explicit agent_devices.")

        if not _is_number(self.reference_kl_coef) or self.reference_kl_coef < 0:
            raise ValueError("reference_kl_coef must be >= 0.")
        if self.reference_kl_enabled and self.reference_devices is not None:
            self._check_device_list("reference_devices", self.reference_devices)

        if self.num_turns != 1:
            raise ValueError("MADPO currently supports num_turns=1 only.")

        _check_int_at_least("preference_num_candidates", self.preference_num_candidates, 2)
        if self.preference_pairs_per_sample is not None and (
            not _is_int(self.preference_pairs_per_sample) or self.preference_pairs_per_sample < 1
        ):
            raise ValueError("preference_pairs_per_sample must be >= 1 or null.")

        _check_positive("dpo_beta", self.dpo_beta)
        _choose(self, "madpo_reference")
        if not isinstance(self.madpo_length_normalize, bool):
            raise ValueError(f"madpo_length_normalize must be true or false, got {self.madpo_length_normalize!r}.")
        if not _is_number(self.madpo_nll_weight) or self.madpo_nll_weight < 0 or math.isinf(self.madpo_nll_weight):
            raise ValueError("madpo_nll_weight must be a finite number >= 0.")
        _check_int_at_least("environment_steps_per_pair", self.environment_steps_per_pair, 1)

        selection = _choose(self, "pair_selection")
        if selection == "all" and self.preference_pairs_per_sample is not None:
            raise ValueError("preference_pairs_per_sample must be null when pair_selection='all'.")

        # Differs from CoMLRL: these fail here, by name, not after the models have loaded (or never).
        if str(self.joint_mode).strip().lower() not in ("aligned", "align"):
            family = type(self).__name__.removesuffix("Config")
            raise ValueError(f"{family} preference generation currently supports aligned joint_mode only.")
        _check_int_at_least("max_new_tokens", self.max_new_tokens, 1)
        _check_positive("temperature", self.temperature)
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}.")
        _check_int_at_least("top_k", self.top_k, 0, optional=True)
        if not _is_number(self.agent_learning_rate) or self.agent_learning_rate < 0:
            raise ValueError(f"agent_learning_rate must be a number >= 0, got {self.agent_learning_rate!r}.")

        # Our fields, checked after CoMLRL's so a CoMLRL config fails with CoMLRL's message first.
        _check_int_at_least("seed", self.seed, 0)
        _check_int_at_least("eval_samples_per_item", self.eval_samples_per_item, 1)
        _check_int_at_least("generation_batch_size", self.generation_batch_size, 1)
        _check_int_at_least("scoring_batch_size", self.scoring_batch_size, 1)
        _check_positive("max_grad_norm", self.max_grad_norm, optional=True)
        _choose(self, "adamw_implementation")
        _choose(self, "save_strategy")
        _choose(self, "use_chat_template")
        _check_int_at_least("save_total_limit", self.save_total_limit, 1, optional=True)
        _check_int_at_least("lora_r", self.lora_r, 1, optional=True)
        _check_positive("lora_alpha", self.lora_alpha)
        if not _is_number(self.lora_dropout) or not 0 <= self.lora_dropout < 1:
            raise ValueError(f"lora_dropout must be in [0, 1), got {self.lora_dropout!r}.")
        targets = self.lora_target_modules
        if targets is not None and not (
            (isinstance(targets, str) and targets.strip())
            or (
                isinstance(targets, (list, tuple))
                and targets
                and all(isinstance(t, str) and t.strip() for t in targets)
            )
        ):
            raise ValueError(
                f"lora_target_modules must be None, a module name or a non-empty list of module names, got {targets!r}."
            )

    def _check_report_to(self) -> None:
        """``report_to`` as a list of known tracker names (a single name is accepted); "none" stands alone."""
        value = self.report_to
        if value is None:
            return
        names = [value] if isinstance(value, str) else value
        allowed = field_multi_choices(type(self), "report_to")
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"report_to must be a list of tracker names ({', '.join(allowed)}), got {value!r}.")
        cleaned = list(dict.fromkeys(_clean(n) for n in names))
        unknown = [n for n in cleaned if n not in allowed]
        if unknown:
            raise ValueError(f"report_to entries must be one of: {', '.join(allowed)}; got {unknown[0]!r}.")
        if "none" in cleaned and len(cleaned) > 1:
            raise ValueError("report_to: 'none' cannot be combined with other trackers.")
        self.report_to = cleaned

    def _check_device_list(self, name: str, spec: Any) -> None:
        """Shape check of a device spec without torch: a string, or a list of 1 or actor-count entries."""
        actor_count = 1 if self.collaboration_mode == "centralized" else self.num_agents
        if isinstance(spec, str):
            return
        if not isinstance(spec, (list, tuple)) or not all(isinstance(d, (str, int)) for d in spec):
            raise ValueError(f"{name} must be a device string or a list of device strings, got {spec!r}.")
        if len(spec) not in (1, actor_count):
            raise ValueError(f"{name} length ({len(spec)}) must be 1 or {actor_count}.")

    # ---- serialisation: the API key never leaves memory -------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe field values; ``comparator_api_key`` is left out, header values and URL credentials masked.

        Use this, not ``dataclasses.asdict``, which copies the key. Model objects in ``comparator_agents``
        are written as the id they were loaded from.
        """
        values = credentials.public_config({f.name: getattr(self, f.name) for f in fields(self)})
        return {name: _jsonable(value, name) for name, value in values.items() if name not in SECRET_FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MADPOConfig:
        """Build and validate a config from ``to_dict`` output (or any subset); unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"Unknown {cls.__name__} fields: {', '.join(unknown)}.")
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
                raise ValueError("num_generations must be >= 2 for MAGRPO-family MARLHF backends.")
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
            raise ValueError("bt_validation_fraction must be in [0, 0.5).")
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
            "group": "Replay buffer",
        },
    )
    preference_replay_k: int | None = field(
        default=None,
        metadata={
            "help": "nearest_k: number of most recent non-empty round datasets (required, >= 1). current accepts only None or 1.",
            "group": "Replay buffer",
            "applies_when": {"preference_replay_mode": ("nearest_k",)},
            "suggested": 2,
        },
    )
    preference_replay_lambda: float | None = field(
        default=None,
        metadata={
            "help": "lambda_decay: lambda in [0, 1] (required); 0 keeps the newest round only, 1 weights all equally.",
            "group": "Replay buffer",
            "applies_when": {"preference_replay_mode": ("lambda_decay",)},
            "suggested": 0.5,
        },
    )
    preference_replay_sample_size: int | None = field(
        default=None,
        metadata={
            "help": "Pairs drawn per round in nearest_k, all_history and lambda_decay (>= 1); None = this round's pair count, or the latest non-empty dataset's size.",
            "group": "Replay buffer",
            "applies_when": {"preference_replay_mode": ("nearest_k", "all_history", "lambda_decay")},
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
            "applies_when": {"comparator_policy": ("model", "api")},
        },
    )
    comparator_agents: list[Any] | None = field(
        default=None,
        metadata={
            "help": "model comparator: one id/path or model object per agent.",
            "group": "Comparator",
            "applies_when": {"comparator_policy": ("model", "api")},
        },
    )
    comparator_devices: str | list[str] | None = field(
        default=None,
        metadata={
            "help": "Comparator devices: None (agent_devices, else auto), one device, or a list.",
            "group": "Comparator",
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
        },
    )
    comparator_api_model: str | None = field(
        default=None, metadata={"help": "api comparator: 'model' field of each request.", "group": "API comparator"}
    )
    comparator_api_max_n_per_request: int | None = field(
        default=None,
        metadata={
            "help": "openai format: cap on n per request (>= 1); None = all candidates at once (1 for DeepSeek).",
            "group": "API comparator",
        },
    )
    comparator_api_timeout: float = field(
        default=120.0, metadata={"help": "api comparator: seconds per HTTP request (> 0).", "group": "API comparator"}
    )
    comparator_api_headers: dict[str, str] | None = field(
        default=None,
        metadata={
            "help": "api comparator: extra HTTP headers. Values are never saved (written as ***) unless given as ${ENV_VAR}, which is read from the environment.",
            "group": "API comparator",
        },
    )
    comparator_api_key: str | None = field(
        default=None,
        metadata={
            "help": "api comparator: literal key, kept in memory only (never saved, unlike CoMLRL). Prefer comparator_api_key_env.",
            "group": "API comparator",
        },
    )
    comparator_api_key_env: str | None = field(
        default=None,
        metadata={
            "help": "api comparator: environment variable holding the key, read when comparator_api_key is empty.",
            "group": "API comparator",
        },
    )
    comparator_api_key_header: str = field(
        default="Authorization",
        metadata={"help": "api comparator: header that carries the key.", "group": "API comparator"},
    )
    comparator_api_key_prefix: str = field(
        default="Bearer",
        metadata={
            "help": "api comparator: prefix joined to the key with one space; empty sends the key alone.",
            "group": "API comparator",
        },
    )
    comparator_api_response_field: str = field(
        default="completions",
        metadata={
            "help": "generic format: dotted path of the completions in the response JSON.",
            "group": "API comparator",
        },
    )
    comparator_api_extra_body: dict[str, Any] | None = field(
        default=None,
        metadata={
            "help": "api comparator: merged last into every request body (overrides).",
            "group": "API comparator",
        },
    )
    # Differs from CoMLRL: it sends requests one at a time and never retries.
    comparator_api_max_concurrency: int = field(
        default=8,
        kw_only=True,
        metadata={
            "help": "api comparator: requests in flight at once (>= 1). CoMLRL sends one at a time.",
            "group": "API comparator",
        },
    )
    comparator_api_max_retries: int = field(
        default=3,
        kw_only=True,
        metadata={
            "help": "api comparator: retries of a request after HTTP 429/5xx or a timeout (>= 0). CoMLRL never retries.",
            "group": "API comparator",
        },
    )
    comparator_api_backoff_base: float = field(
        default=0.5,
        kw_only=True,
        metadata={
            "help": "api comparator: first retry delay in seconds, doubled on each retry (> 0).",
            "group": "API comparator",
        },
    )
    comparator_api_backoff_max: float = field(
        default=60.0,
        kw_only=True,
        metadata={
            "help": "api comparator: longest delay in seconds between two retries of our own backoff (> 0).",
            "group": "API comparator",
        },
    )
    comparator_api_retry_after_max: float = field(
        default=60.0,
        kw_only=True,
        metadata={
            "help": "api comparator: longest Retry-After wait in seconds the server may ask for (> 0); a longer one fails the request at once, naming this cap.",
            "group": "API comparator",
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
                raise ValueError(f"comparator_centralized_agent_index must be in [0, {self.num_agents}).")  # type: ignore[attr-defined]

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
        url = self.comparator_api_url
        if url:
            parts = urlsplit(url) if isinstance(url, str) else None
            if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
                # The URL may hold a credential: name its scheme, never the URL itself.
                scheme = parts.scheme if parts is not None else type(url).__name__
                raise ValueError(f"comparator_api_url must be an http(s) URL with a host, got scheme {scheme!r}.")

    def _check_replay(self) -> None:
        mode = _choose(self, "preference_replay_mode")
        k, lam, size = self.preference_replay_k, self.preference_replay_lambda, self.preference_replay_sample_size
        k_only_nearest = "preference_replay_k is only valid when preference_replay_mode='nearest_k'."
        lambda_only_decay = "preference_replay_lambda is only valid when preference_replay_mode='lambda_decay'."

        if mode == "current":
            if k is not None and not (_is_int(k) and k == 1):
                raise ValueError("preference_replay_k must be null or 1 when preference_replay_mode='current'.")
            if lam is not None:
                raise ValueError(lambda_only_decay)
            if size is not None:
                raise ValueError(
                    "preference_replay_sample_size is only valid when preference_replay_mode is "
                    "'nearest_k', 'all_history', or 'lambda_decay'."
                )
            return
        if mode == "nearest_k":
            if k is None:
                raise ValueError("preference_replay_k is required when preference_replay_mode='nearest_k'.")
            _check_int_at_least("preference_replay_k", k, 1)
        elif k is not None:
            raise ValueError(k_only_nearest)
        if mode == "lambda_decay":
            if lam is None:
                raise ValueError("preference_replay_lambda is required when preference_replay_mode='lambda_decay'.")
            if not _is_number(lam) or not 0 <= lam <= 1:
                raise ValueError("preference_replay_lambda must be in [0, 1].")
        elif lam is not None:
            raise ValueError(lambda_only_decay)
        _check_int_at_least("preference_replay_sample_size", size, 1, optional=True)

    def _check_comparator_policy(self) -> None:
        policy = _choose(self, "comparator_policy")
        has_model = self.comparator_model_name is not None or self.comparator_agents is not None
        model_only = "comparator_model_name and comparator_agents are only valid when comparator_policy='model'."
        history_only = "comparator_history_k is only valid when comparator_policy='history'."

        if policy == "model":
            if not has_model:
                raise ValueError(
                    "comparator_model_name or comparator_agents is required when comparator_policy='model'."
                )
            if self.comparator_history_k is not None:
                raise ValueError(history_only)
            return
        if policy == "history":
            if self.comparator_history_k is None:
                self.comparator_history_k = 1
            _check_int_at_least("comparator_history_k", self.comparator_history_k, 1)
        elif self.comparator_history_k is not None:
            raise ValueError(history_only)
        # CoMLRL lets the api comparator carry model fields it never uses; only current/copy/history reject them.
        if policy != "api" and has_model:
            raise ValueError(model_only)
        if policy == "api" and not self.comparator_api_url:
            raise ValueError("comparator_api_url is required when comparator_policy='api'.")


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
