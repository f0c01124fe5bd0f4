"""A Hugging Face dataset card (``README.md``) for an export, written from what the store and the run's spec record.

The card is the YAML header the Hub and ``datasets`` read (``configs`` naming each data file, ``dataset_info`` with
its ``features``, so a JSONL file loads with the same types as the Parquet one) and prose: the run (id, algorithm,
the config fields that differ from the defaults, models, task, preference source or oracle, comparator, seed,
rounds), the pairs per round and what was left out, what each column means, and how to load the files and train
on them with TRL's ``DPOTrainer``. Nothing in it is written by hand: the exporters gather the facts (``CardFacts``)
and this module only lays them out. It does not query the store or write files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import yaml

from comlrl_lab.store.dataset_schema import yaml_features

#: The first line of every card's body: how an export knows a README.md it may replace.
CARD_MARKER = "<!-- comlrl-lab dataset card:"
CARD_FILE = "README.md"

#: Reasons a TRL file leaves a comparison out, in the order the card lists them.
LEFT_OUT_REASONS: tuple[str, ...] = ("tie", "both_bad", "split", "awaiting_labels")
_REASON_TEXT = {
    "tie": "every label says tie",
    "both_bad": "every label says both bad",
    "split": "the labels disagree and no side has more than half",
    "awaiting_labels": "no label yet",
}
#: Config fields that name folders on the machine that ran: left out of a card, which may be published.
LOCAL_FIELDS = frozenset({"output_dir", "preference_replay_dir", "policy_checkpoint_dir"})


@dataclass(frozen=True)
class RunAbout:
    """What a card says about a run that the store does not hold; the engine reads it from the run's spec.

    ``models``: each agent's model as the spec names it; ``task``: the built-in task or the user task's file name;
    ``changed_config``: the config fields whose value differs from the algorithm's default (None: not known).
    """

    models: tuple[str, ...] = ()
    task: str | None = None
    changed_config: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class CardFile:
    """One data file beside the card: its ``configs`` name, path relative to the card, schema and row count."""

    config_name: str
    path: str
    schema: pa.Schema
    rows: int
    sha256: str = ""
    conversational: bool = False


@dataclass(frozen=True)
class RoundCount:
    """One round's comparisons in the store, the rows this export took from it, and (TRL) what it left out."""

    round: int
    stored: int
    exported: int
    left_out: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class CardFacts:
    """Everything a card shows. ``kind`` is "pairs" (one file of joint pairs) or "trl" (one file per actor)."""

    run: Mapping[str, Any]  # the store's runs row: run_id, trainer, status, source, created_at, config_json
    kind: str
    file_format: str  # jsonl, parquet or csv
    files: Sequence[CardFile]
    rounds: Sequence[RoundCount]
    filters: Mapping[str, Any] = field(default_factory=dict)
    about: RunAbout = field(default_factory=RunAbout)
    version: str = ""


_COLUMN_HELP = {
    "round": "Round (iteration) the pair was collected in, from 1.",
    "pair_index": "The pair's position in its round, from 0 (a labelled run's comparison index).",
    "item_index": "Index of the task item among the run's training items.",
    "winner_candidate_index": "Candidate index of the joint response the reward function ranked higher.",
    "loser_candidate_index": "Candidate index of the other joint response.",
    "winner_side": "Which side the reward function ranked higher: `current` (the agents trained) or `comparator`.",
    "prompts": "Each agent's prompt as it was sampled from (rendered through the chat template where one applied).",
    "winner_completions": "Each agent's part of the joint response the reward function ranked higher.",
    "loser_completions": "Each agent's part of the other joint response.",
    "winner_reward": "Reward of the higher-ranked joint response, after the reward processor.",
    "loser_reward": "Reward of the other joint response, after the reward processor.",
    "candidate_reward_mean": "Mean reward of the task item's candidates.",
    "raw_rewards": "[winner, loser] rewards before the reward processor (iterative runs; [] otherwise).",
    "target_raw_reward": "Raw reward of the current agents' joint response (iterative runs).",
    "comparator_raw_reward": "Raw reward of the comparator's joint response (iterative runs).",
    "labels": "The comparison's verdicts as `[{labeller, verdict}]` in the order given (A, B, tie, both_bad); [] "
    "where the reward function labels.",
}
_PAIR_HELP = {
    "reward_gap": "`winner_reward - loser_reward`.",
    "prompt": "TRL's prompt: the agents' prompts as one text (`[Agent 1]` ... blocks when there are several).",
    "chosen": "TRL's chosen: the preferred joint response as one text; empty where no side is preferred.",
    "rejected": "TRL's rejected: the other joint response as one text; empty where no side is preferred.",
}
_TRL_HELP = {
    "reward_gap": "Reward of `chosen` minus reward of `rejected` (negative where the labels overrule the reward).",
    "prompt": "What this agent was prompted with: its text, or the messages (system prompt included) its chat "
    "template rendered.",
    "chosen": "This agent's part of the preferred joint response (an assistant message in the conversational form).",
    "rejected": "This agent's part of the other joint response.",
}


def dataset_card(facts: CardFacts) -> str:
    """The card's text: YAML header, then prose."""
    return "---\n" + yaml.safe_dump(_header(facts), sort_keys=False, allow_unicode=True) + "---\n" + _body(facts)


def _config(facts: CardFacts) -> dict[str, Any]:
    return json.loads(facts.run.get("config_json") or "{}")


def _header(facts: CardFacts) -> dict[str, Any]:
    rows = max((f.rows for f in facts.files), default=0)
    tags = ["comlrl-lab", "preference", "dpo", "multi-agent"] + (["trl"] if facts.kind == "trl" else [])
    configs, infos = [], []
    for index, file in enumerate(facts.files):
        config = {"config_name": file.config_name, "data_files": [{"split": "train", "path": file.path}]}
        # datasets caches a card's configs by their YAML (data files by pattern, not content): the file's digest
        # in the description makes a file written again a new cache entry instead of last time's rows.
        config["description"] = f"{file.path}: {file.rows} rows, sha256 {file.sha256}"
        configs.append({**config, "default": True} if index == 0 and len(facts.files) > 1 else config)
        infos.append({"config_name": file.config_name, "features": yaml_features(file.schema)})
    return {
        "pretty_name": _title(facts),
        "tags": tags,
        "task_categories": ["text-generation"],
        "size_categories": [_size_category(rows)],
        "configs": configs,
        "dataset_info": infos,
    }


def _size_category(rows: int) -> str:
    """The Hub's size bucket for ``rows`` examples."""
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if rows < limit:
            return name
    return "1M<n<10M" if rows < 10_000_000 else "10M<n<100M"


def _title(facts: CardFacts) -> str:
    what = "TRL preference pairs per agent" if facts.kind == "trl" else "preference pairs"
    return f"comlrl-lab run {facts.run['run_id']}: {what}"


def _body(facts: CardFacts) -> str:
    run_id = facts.run["run_id"]
    parts = [
        f"{CARD_MARKER} written by `comlrl-lab export` {facts.version} from the store of run {run_id}; "
        "exporting again replaces it -->",
        "",
        f"# {_title(facts)}",
        "",
        _summary(facts),
        "",
        "## Files",
        "",
        "| config | file | rows | form |",
        "|---|---|---|---|",
        *(f"| `{f.config_name}` | `{f.path}` | {f.rows:,} | {_form(facts, f)} |" for f in facts.files),
        "",
        *_run_section(facts),
        *_rounds_section(facts),
        *_columns_section(facts),
        *_usage_section(facts),
    ]
    return "\n".join(parts) + "\n"


def _form(facts: CardFacts, file: CardFile) -> str:
    if facts.kind != "trl":
        return "joint pairs, list columns as JSON text" if facts.file_format == "csv" else "joint pairs"
    return "TRL conversational (messages)" if file.conversational else "TRL standard (text)"


def _summary(facts: CardFacts) -> str:
    config = _config(facts)
    if facts.kind == "trl":
        actors = len(facts.files)
        who = (
            "The run's one actor wrote every role's output in one joint completion (centralized collaboration), so "
            "there is one file."
            if config.get("collaboration_mode") == "centralized"
            else f"One file per agent ({actors}): each row is a pair as that agent saw it, its own prompt with its "
            "own part of the preferred and the other joint response, as MADPO trains each agent."
        )
        return (
            f"Preference pairs of run `{facts.run['run_id']}` in the form TRL's `DPOTrainer` takes. {who} "
            "Comparisons without a preferred side (ties, both bad, split votes, not labelled yet) are left out and "
            "counted per round below."
        )
    note = " List columns are JSON text in CSV." if facts.file_format == "csv" else ""
    return (
        f"Preference pairs of run `{facts.run['run_id']}`: the seed's pair records with their provenance and labels, "
        f"one row per pair.{note} The `prompt`, `chosen` and `rejected` columns join every agent's text, so a "
        "single model trained on them learns to write every part; `comlrl-lab export RUN --format trl` writes one "
        "file per agent instead."
    )


def _oracle(config: Mapping[str, Any], run_source: str | None) -> str:
    if run_source == "import":
        return "not recorded (pairs imported from files)"
    source = config.get("preference_source", "reward")
    if source == "human":
        need = config.get("labels_per_comparison", 1)
        return (
            f"people's verdicts (`preference_source: human`, {need} label(s) per comparison); the side more than half "
            "of the labels prefer is chosen"
        )
    if source == "judge":
        model = config.get("judge_api_model") or "an LLM"
        return (
            f"an LLM judge (`preference_source: judge`, `{model}` through the `{config.get('judge_api_format')}` "
            "API), asked in both orders; a verdict counts when both orders agree"
        )
    if config.get("preference_scoring_reward") == "reward_model":
        return (
            "the latest fitted reward model (`preference_scoring_reward: reward_model`; the task reward until one "
            "exists); the higher-scored joint response wins and ties are dropped"
        )
    return "the task's reward function (after its reward processor); the higher-scored joint response wins and ties are dropped when pairs are made"


def _comparator(config: Mapping[str, Any]) -> str | None:
    policy = config.get("comparator_policy")
    if policy is None:
        return None
    detail = {
        "model": config.get("comparator_model_name"),
        "history": _rounds_back(config.get("comparator_history_k")),
        "api": config.get("comparator_api_model"),
    }.get(str(policy))
    mode = (
        " (centralized: one model writes every role)"
        if config.get("comparator_generation_mode") == "centralized"
        else ""
    )
    return f"`{policy}`" + (f" ({detail})" if detail else "") + mode


def _rounds_back(k: Any) -> str | None:
    return None if not k else f"{k} round back" if k == 1 else f"{k} rounds back"


def _run_section(facts: CardFacts) -> list[str]:
    run, config, about = facts.run, _config(facts), facts.about
    lines = ["## The run", "", f"- Run id: `{run['run_id']}`"]
    lines.append(
        f"- Algorithm: `{run.get('trainer') or 'unknown'}` (status {run.get('status')}, source {run.get('source')})"
    )
    if about.models:
        for index, model in enumerate(about.models):
            lines.append(f"- Model of agent {index}: `{model}`")
    else:
        lines.append("- Models: not recorded in the store")
    lines.append(f"- Task: `{about.task}`" if about.task else "- Task: not recorded in the store")
    lines.append(f"- Preference source: {_oracle(config, run.get('source'))}")
    comparator = _comparator(config)
    if comparator:
        lines.append(f"- Comparator: {comparator}")
    if "seed" in config:
        lines.append(f"- Seed: {config['seed']}")
    collected = [r.round for r in facts.rounds]
    planned = config.get("num_iterations")
    rounds = f"{len(collected)} collected" + (f" of {planned} planned (`num_iterations`)" if planned else "")
    lines.append(f"- Rounds: {rounds}")
    if facts.filters:
        shown = ", ".join(f"{k}={v!r}" for k, v in facts.filters.items())
        lines.append(f"- Filters of this export: {shown}")
    lines += ["", *_changed_config(about.changed_config), ""]
    return lines


def _changed_config(changed: Mapping[str, Any] | None) -> list[str]:
    if changed is None:
        return ["Config: the algorithm's defaults are not known here; `runs.config_json` in the store has every field."]
    shown = {k: v for k, v in changed.items() if k not in LOCAL_FIELDS}
    if not shown:
        return ["Config: every field has its default (folders on the machine that ran are left out)."]
    return [
        "Config fields that differ from the algorithm's defaults (folders on the machine that ran are left out):",
        "",
        "| field | value |",
        "|---|---|",
        *(f"| `{k}` | `{json.dumps(v, ensure_ascii=False)}` |" for k, v in sorted(shown.items())),
    ]


def _rounds_section(facts: CardFacts) -> list[str]:
    labelled = _config(facts).get("preference_source", "reward") != "reward"
    reasons = LEFT_OUT_REASONS if labelled else ()
    exported = "rows per file" if facts.kind == "trl" else "rows"
    head = f"| round | comparisons stored | {exported} |" + "".join(
        f" no side: {r.replace('_', ' ')} |" for r in reasons
    )
    lines = ["## Pairs per round", "", head, "|---|---|---|" + "---|" * len(reasons)]
    for r in facts.rounds:
        left = "".join(f" {r.left_out.get(reason, 0)} |" for reason in reasons)
        lines.append(f"| {r.round} | {r.stored:,} | {r.exported:,} |{left}")
    lines += ["", f"{sum(r.exported for r in facts.rounds):,} {exported} in all."]
    if labelled:
        why = "; ".join(f"{r.replace('_', ' ')}: {_REASON_TEXT[r]}" for r in LEFT_OUT_REASONS)
        kept = (
            "A TRL file leaves out every comparison without a preferred side"
            if facts.kind == "trl"
            else "A comparison without a preferred side keeps empty `chosen` and `rejected`"
        )
        lines.append(f"{kept}: no side has more than half of its labels ({why}).")
    lines.append("Reward ties never become pairs: the trainers drop them when pairs are made, so no round stores them.")
    return [*lines, ""]


def _columns_section(facts: CardFacts) -> list[str]:
    helps = {**_COLUMN_HELP, **(_TRL_HELP if facts.kind == "trl" else _PAIR_HELP)}
    lines = ["## Columns", "", "| column | type | meaning |", "|---|---|---|"]
    for name in facts.files[0].schema.names if facts.files else ():
        types = {f.config_name: _type_text(f.schema.field(name).type) for f in facts.files}
        shown = (
            next(iter(types.values()))
            if len(set(types.values())) == 1
            else "; ".join(f"{config}: {text}" for config, text in types.items())
        )
        lines.append(f"| `{name}` | {shown} | {helps.get(name, '')} |")
    return [*lines, ""]


def _type_text(arrow_type: pa.DataType) -> str:
    """A column's type as the ``features`` name it: ``int64``, ``list[string]``, ``list[{labeller, verdict}]``."""
    features = yaml_features(pa.schema([("x", arrow_type)]))[0]
    if "dtype" in features:
        return f"`{features['dtype']}`"
    inner = features["list"]
    return f"`list[{inner}]`" if isinstance(inner, str) else "`list[{" + ", ".join(f["name"] for f in inner) + "}]`"


def _usage_section(facts: CardFacts) -> list[str]:
    first = facts.files[0].config_name if facts.files else "default"
    config = _config(facts)
    beta = config.get("dpo_beta", 0.1)
    load = [
        "## Load it",
        "",
        "```python",
        "from datasets import load_dataset",
        "",
        f'pairs = load_dataset("path/to/this/folder", "{first}", split="train")  # the folder holding this card',
        "```",
        "",
        "The card's `dataset_info` gives every column its type, so every format of every run loads with the same "
        "features and the datasets of two runs concatenate (`datasets.concatenate_datasets`).",
        "",
    ]
    if facts.kind != "trl":
        return load
    model = facts.about.models[0] if facts.about.models else "<agent 0's model>"
    return [
        *load,
        "## Train on it with TRL",
        "",
        "Each agent's file trains that agent's model with TRL's `DPOTrainer`; `beta` below is the run's "
        "`dpo_beta` (MADPO's η).",
        "",
        "```python",
        "from datasets import load_dataset",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "from trl import DPOConfig, DPOTrainer",
        "",
        f"model_id = {json.dumps(model)}  # agent 0's model as the run names it",
        "# (a registered name or the embedded model: comlrl_lab.models.loading.resolve_model_source(name) is its folder)",
        "model = AutoModelForCausalLM.from_pretrained(model_id)",
        "tokenizer = AutoTokenizer.from_pretrained(model_id)",
        f'pairs = load_dataset("path/to/this/folder", "{first}", split="train")',
        f'args = DPOConfig(output_dir="{first}-dpo", beta={beta})',
        "DPOTrainer(model=model, args=args, train_dataset=pairs, processing_class=tokenizer).train()",
        "```",
        "",
    ]
