"""TRL's preference datasets from a run: one file per agent, each pair as that agent saw it, and a dataset card.

MADPO trains each agent on its own side of a pair: its prompt, its part of the preferred joint response, its part
of the other. ``export_trl`` writes that as TRL's ``DPOTrainer`` takes it, ``DIR/agent_<i>.jsonl`` (or ``.parquet``)
per actor: ``prompt``, ``chosen``, ``rejected`` as texts (TRL's standard form), or for an agent whose prompts went
through its chat template (``chat_forms``) as messages (TRL's conversational form, the template's system prompt
included), plus ``round``, ``pair_index``, ``item_index``, ``reward_gap`` and ``labels``. A centralized run has one
actor, so one file. A comparison without a preferred side (ties, both bad, split votes, no labels yet) trains on
nothing and is left out; the card (``DIR/README.md``) counts it per round. The files are written by DuckDB's
``COPY`` through ``.tmp`` names, renamed together once all are written, and the card after them. This module does not load tokenizers: the engine finds
the chat forms (``engine.exports``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from comlrl_lab.data.chat_form import ChatForm
from comlrl_lab.store import queries
from comlrl_lab.store.card import LEFT_OUT_REASONS, CardFacts, CardFile, RunAbout
from comlrl_lab.store.dataset_schema import select_as, trl_schema
from comlrl_lab.store.export import (
    ExportError,
    card_path,
    check_destination,
    check_run,
    copy_options,
    decided_pairs,
    file_sha256,
    open_store,
    round_counts,
    sql_path,
    write_card,
    written_through_tmp,
)
from comlrl_lab.store.formats import TRL_FILE_FORMATS
from comlrl_lab.store.runstore import RunStore


@dataclass
class TrlExport:
    """What ``export_trl`` wrote: the per-actor files, the card, the pairs in each file, and the comparisons it left
    out by reason (tie, both_bad, split, awaiting_labels)."""

    files: list[Path]
    card: Path
    rows: int
    left_out: dict[str, int] = field(default_factory=dict)


def export_trl(
    store_or_path: RunStore | str | os.PathLike[str],
    run_id: str,
    dest_dir: str | os.PathLike[str],
    *,
    file_format: str = "jsonl",
    chat_forms: Sequence[ChatForm | None] = (),
    about: RunAbout | None = None,
    **filters: Any,
) -> TrlExport:
    """Write the run's pairs (all, or those matching ``filters``) into ``dest_dir`` as TRL datasets, one per actor.

    ``chat_forms``: per actor, the ``ChatForm`` of its chat template (its rows become messages) or None (texts);
    empty: texts for every actor. ``about``: what the card tells beyond the store (``engine.exports`` reads it from
    the run's spec). A README.md in ``dest_dir`` that no export wrote is never replaced (``ExportError``).
    """
    if file_format not in TRL_FILE_FORMATS:
        raise ValueError(f"file_format must be one of {list(TRL_FILE_FORMATS)}, got {file_format!r}")
    flt = queries.pair_filter(**filters)
    dest_dir = check_destination(dest_dir)
    card_at = card_path(dest_dir)
    with open_store(store_or_path) as store:
        check_run(store, run_id)
        cur = store.cursor()
        info = store.run(run_id) or {}
        config = json.loads(info.get("config_json") or "{}")
        labelled = config.get("preference_source", "reward") != "reward"
        forms = list(chat_forms) or [None] * _actors(cur, run_id, config, info)
        if len(forms) != _actors(cur, run_id, config, info):
            raise ValueError(
                f"chat_forms has {len(forms)} entries but run {run_id!r} has {_actors(cur, run_id, config, info)} "
                "actors (one per agent; one for centralized collaboration)"
            )
        where, args = flt.where(run_id)
        decided = f"SELECT * FROM ({decided_pairs(labelled)}) WHERE {where}"
        for index, form in enumerate(forms):
            if form is not None:
                _check_rendered(cur, decided, args, index, form)
        dest_dir.mkdir(parents=True, exist_ok=True)
        suffix = "." + file_format
        written, card_files = [], []
        with ExitStack() as files:
            for index, form in enumerate(forms):
                path = dest_dir / f"agent_{index}{suffix}"
                tmp = files.enter_context(written_through_tmp(path))
                schema = trl_schema(form is not None)
                columns = select_as(schema, _agent_expressions(index + 1, form))
                sql = f"SELECT {columns} FROM ({decided}) WHERE chosen_side IS NOT NULL ORDER BY round, pair_index"
                copy = f"COPY ({sql}) TO {sql_path(tmp)} ({copy_options(file_format)})"
                rows = int(cur.execute(copy, [*_system_args(form), *args]).fetchone()[0])
                written.append(path)
                card_files.append(CardFile(path.stem, path.name, schema, rows, file_sha256(tmp), form is not None))
            rounds = round_counts(cur, run_id, flt, labelled, exported_only=True)
            facts = CardFacts(
                info,
                "trl",
                file_format,
                card_files,
                rounds,
                {k: v for k, v in filters.items() if v is not None},
                about or RunAbout(),
            )
        write_card(card_at, facts)  # after the data files are in place
    left_out = {reason: sum(r.left_out.get(reason, 0) for r in rounds) for reason in LEFT_OUT_REASONS}
    return TrlExport(written, card_at, sum(r.exported for r in rounds), left_out)


def _actors(cur: Any, run_id: str, config: dict[str, Any], info: dict[str, Any]) -> int:
    """Files to write: one per prompt of a stored pair (one agent each; centralized: the one actor), else what the
    config says (no pair stored)."""
    stored = cur.execute("SELECT max(len(prompts)) FROM pairs WHERE run_id = ?", [run_id]).fetchone()[0]
    if stored:
        return int(stored)
    if config.get("collaboration_mode") == "centralized":
        return 1
    return int(config.get("num_agents") or info.get("num_agents") or 1)


def _agent_expressions(position: int, form: ChatForm | None) -> dict[str, str]:
    """SQL for agent ``position`` (1-based, DuckDB's list index) over ``decided_pairs``: its own prompt and parts of
    the chosen and the other joint response, and the chosen side's reward gap."""
    winner, loser = f"winner_completions[{position}]", f"loser_completions[{position}]"
    chosen = f"CASE chosen_side WHEN 'winner' THEN {winner} ELSE {loser} END"
    rejected = f"CASE chosen_side WHEN 'winner' THEN {loser} ELSE {winner} END"
    prompt = f"prompts[{position}]"
    expressions = {"reward_gap": "CASE chosen_side WHEN 'winner' THEN reward_gap ELSE -reward_gap END"}
    if form is None:
        return {**expressions, "prompt": prompt, "chosen": chosen, "rejected": rejected}
    # The user message is the rendered prompt less the template's prefix and suffix (``ChatForm.user_message``);
    # DuckDB's substr and length count characters, as Python's slicing and len do.
    start, around = len(form.prefix) + 1, len(form.prefix) + len(form.suffix)
    user = f"{{'role': 'user', 'content': substr({prompt}, {start}, length({prompt}) - {around})}}"
    system = "" if form.system is None else "{'role': 'system', 'content': ?::VARCHAR}, "  # bound: _system_args
    return {
        **expressions,
        "prompt": f"[{system}{user}]",
        "chosen": f"[{{'role': 'assistant', 'content': {chosen}}}]",
        "rejected": f"[{{'role': 'assistant', 'content': {rejected}}}]",
    }


def _system_args(form: ChatForm | None) -> list[Any]:
    """The parameter ``_agent_expressions`` leaves for the system prompt (its SELECT list comes before the filters)."""
    return [] if form is None or form.system is None else [form.system]


def _check_rendered(cur: Any, decided: str, args: list[Any], index: int, form: ChatForm) -> None:
    """``ExportError`` naming the first exported pair whose agent ``index`` prompt is not ``form``'s rendering of one
    user message (the run's template changed, or its prompts were not rendered by it)."""
    prompt = f"prompts[{index + 1}]"
    found = cur.execute(
        f"SELECT round, pair_index FROM ({decided}) WHERE chosen_side IS NOT NULL AND NOT "
        f"(starts_with({prompt}, ?) AND ends_with({prompt}, ?) AND length({prompt}) >= ?) "
        "ORDER BY round, pair_index LIMIT 1",
        [*args, form.prefix, form.suffix, len(form.prefix) + len(form.suffix)],
    ).fetchone()
    if found is not None:
        raise ExportError(
            f"agent {index}'s prompt in round {found[0]} pair {found[1]} is not its chat template's rendering of one "
            "user message, so it cannot be written as messages; export the texts instead (--prompt-form standard)"
        )
