"""Exports of a run: the store's exports, with what only the run's spec and its models' tokenizers tell.

The store holds the pairs and the config the run ran with; the run folder's spec also names the agents' models and
the task. ``run_about`` gives a dataset card those and the config fields that differ from the algorithm's defaults.
``actor_chat_forms`` says which actors' prompts went through a chat template, decided as the trainer decides it
(``use_chat_template`` from the stored config, and each actor's tokenizer, loaded alone: ``models.chat``), so a TRL
export gives those actors' rows as messages; the run does not record it otherwise. ``export_run`` is the one
export call of the command line and the workbench. This module does not write SQL (the store does).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from comlrl_lab.data.chat_form import ChatForm
from comlrl_lab.data.reward_distribution import DISTRIBUTION_DIR
from comlrl_lab.engine.spec import ExperimentSpec
from comlrl_lab.store.card import CARD_FILE, RunAbout
from comlrl_lab.store.export import export_pairs, export_reward_distribution_files, export_round_files
from comlrl_lab.store.formats import CARD_FORMATS, EXPORT_FORMATS, ROUND_FILES, TRL_FILES, TRL_PROMPT_FORMS
from comlrl_lab.store.runstore import RunStore
from comlrl_lab.store.trl_export import export_trl
from comlrl_lab.trainers.preference.algorithms import ALGORITHM_TABLE


@dataclass
class RunExport:
    """What ``export_run`` wrote: the data files (or round files), the pairs in each data file (or the round files
    written), the dataset card, and the comparisons a TRL export left out by reason."""

    paths: list[Path]
    count: int
    card: Path | None = None
    left_out: dict[str, int] = field(default_factory=dict)


def stored_config(store: RunStore, run_id: str) -> dict[str, Any]:
    """The config the run ran with, as the store holds it ({} for an imported pair set)."""
    info = store.run(run_id) or {}
    return json.loads(info.get("config_json") or "{}")


def run_about(spec: ExperimentSpec | None, config: Mapping[str, Any], trainer: str | None) -> RunAbout:
    """The models, task and changed config fields a card shows; an empty ``RunAbout`` without a spec (an imported
    pair set, a bare store). Defaults are those of the stored ``trainer``'s config class."""
    row = ALGORITHM_TABLE.get(str(trainer or (spec.algorithm if spec else "")))
    changed = None
    if row is not None and config:
        defaults = row.config_class().to_dict()
        changed = {k: v for k, v in config.items() if k not in defaults or defaults[k] != v}
    if spec is None:
        return RunAbout(changed_config=changed)
    task = spec.task
    if task is None and spec.user_task:
        data = f" on {Path(spec.user_train_data).name}" if spec.user_train_data else ""
        task = f"{Path(spec.user_task).name}{data} (a user task)"
    return RunAbout(models=tuple(_agent_models(spec, config)), task=task, changed_config=changed)


def _agent_models(spec: ExperimentSpec, config: Mapping[str, Any]) -> list[str]:
    """One model per agent, as ``build_trainer`` hands them to the trainer (one name stands for every agent)."""
    models = list(spec.agent_models)
    count = int(config.get("num_agents") or len(models))
    return models * count if len(models) == 1 and count > 1 else models


def actor_sources(spec: ExperimentSpec, config: Mapping[str, Any]) -> list[str]:
    """The model each actor was loaded from: every agent's, or under centralized collaboration the one actor's."""
    models = _agent_models(spec, config)
    return models[:1] if config.get("collaboration_mode") == "centralized" else models


def actor_chat_forms(spec: ExperimentSpec, config: Mapping[str, Any]) -> list[ChatForm | None]:
    """Per actor, its template's ``ChatForm`` where its prompts went through it, else None (see the module)."""
    from comlrl_lab.models.chat import agent_chat_forms  # loads transformers: only a TRL export needs it

    setting = str(config.get("use_chat_template", "false"))  # a run stored before the field rendered no template
    return agent_chat_forms(actor_sources(spec, config), setting, spec.model_config)


def export_run(
    store: RunStore,
    run_id: str,
    fmt: str,
    dest: str | os.PathLike[str],
    *,
    spec: ExperimentSpec | None = None,
    trl_as: str = "jsonl",
    prompt_form: str = "auto",
    card: bool = True,
    **filters: Any,
) -> RunExport:
    """Export run ``run_id`` of ``store`` as ``fmt`` (an ``EXPORT_FORMATS`` name) to ``dest``: a file for pairs, a
    folder for round files and TRL datasets. ``spec`` is the run's (``spec.json``), None for an imported pair set.

    TRL (``trl``): one file per actor as ``trl_as`` (jsonl or parquet), rows as messages for the actors a chat
    template prompted (``prompt_form`` "auto") or as texts ("standard"), and the dataset card. Pairs: the card
    beside a JSONL, Parquet or CSV file unless ``card`` is False. Round files: CoMLRL's ``iteration_NNNN.json``
    and the logged reward distributions. ``filters`` (the pair browser's) apply to pairs and TRL datasets.
    """
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {list(EXPORT_FORMATS)}, got {fmt!r}")
    if prompt_form not in TRL_PROMPT_FORMS:
        raise ValueError(f"prompt_form must be one of {list(TRL_PROMPT_FORMS)}, got {prompt_form!r}")
    if fmt == ROUND_FILES:
        files = export_round_files(store, run_id, dest)
        export_reward_distribution_files(store, run_id, Path(dest) / DISTRIBUTION_DIR)
        return RunExport(files, len(files))
    config = stored_config(store, run_id)
    about = run_about(spec, config, (store.run(run_id) or {}).get("trainer"))
    if fmt == TRL_FILES:
        forms = actor_chat_forms(spec, config) if spec is not None and prompt_form == "auto" else []
        made = export_trl(store, run_id, dest, file_format=trl_as, chat_forms=forms, about=about, **filters)
        return RunExport(made.files, made.rows, made.card, made.left_out)
    count = export_pairs(store, run_id, fmt, dest, card=card, about=about, **filters)
    card_at = Path(dest).expanduser().parent / CARD_FILE if card and fmt in CARD_FORMATS else None
    return RunExport([Path(dest)], count, card_at)
