"""Writes to the store: records become Arrow tables, and each phase is committed in one transaction.

A commit is idempotent: committing the same (run, round, phase) again deletes that phase's rows and appends the new
ones inside the same transaction, so a run killed after a commit and resumed before its checkpoint never duplicates
a row. Rows are appended in bulk (an Arrow table registered with DuckDB and ``INSERT ... SELECT``), never one by one.
This module does not read for the UI (``queries``) and does not hold the connection (``RunStore``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from comlrl_lab.data.labels import Label, check_side, check_verdict
from comlrl_lab.data.records import JointCandidate, PreferencePair
from comlrl_lab.store.schema import ALL_PHASES, PHASE_TABLES, TABLES, utcnow

WINNER_SIDES = ("current", "comparator")
CANDIDATE_SIDES = ("current", "comparator", "eval")  # eval: fresh samples of the evaluate phase

_STR_LIST = pa.list_(pa.string())
_INT_LIST = pa.list_(pa.int32())
_FLOAT_LIST = pa.list_(pa.float64())

# Column layouts of the staged Arrow tables; run_id, round and phase are added by the INSERT.
CANDIDATE_SCHEMA = pa.schema(
    [
        ("item_index", pa.int32()),
        ("side", pa.string()),
        ("candidate_index", pa.int32()),
        ("prompts", _STR_LIST),
        ("completions", _STR_LIST),
        ("prompt_token_counts", _INT_LIST),
        ("token_counts", _INT_LIST),
        ("raw_reward", pa.float64()),
        ("reward", pa.float64()),
        ("parse_status", pa.string()),
        ("details_json", pa.string()),
    ]
)
PAIR_SCHEMA = pa.schema(
    [
        ("pair_index", pa.int32()),
        ("item_index", pa.int32()),
        ("winner_candidate_index", pa.int32()),
        ("loser_candidate_index", pa.int32()),
        ("winner_side", pa.string()),
        ("prompts", _STR_LIST),
        ("winner_completions", _STR_LIST),
        ("loser_completions", _STR_LIST),
        ("winner_reward", pa.float64()),
        ("loser_reward", pa.float64()),
        ("candidate_reward_mean", pa.float64()),
        ("raw_rewards", _FLOAT_LIST),
        ("target_raw_reward", pa.float64()),
        ("comparator_raw_reward", pa.float64()),
        ("reward_gap", pa.float64()),
        ("winner_token_counts", _INT_LIST),
        ("loser_token_counts", _INT_LIST),
        ("extra_json", pa.string()),
    ]
)
REPLAY_SCHEMA = pa.schema(
    [
        ("source_round", pa.int32()),
        ("mode", pa.string()),
        ("weight", pa.float64()),
        ("drawn_count", pa.int32()),
        ("num_pairs", pa.int32()),
    ]
)
METRIC_SCHEMA = pa.schema([("step", pa.int32()), ("name", pa.string()), ("value", pa.float64())])
EVENT_SCHEMA = pa.schema(
    [("ts", pa.timestamp("us")), ("level", pa.string()), ("message", pa.string()), ("traceback", pa.string())]
)
DISTRIBUTION_SCHEMA = pa.schema(
    [
        ("series", pa.string()),
        ("side", pa.string()),
        ("reward_min", pa.float64()),
        ("reward_max", pa.float64()),
        ("bin_edges", _FLOAT_LIST),
        ("counts", _INT_LIST),
        ("sample_count", pa.int32()),
        ("mean", pa.float64()),
        ("raw_rewards", _FLOAT_LIST),
    ]
)
LABEL_SCHEMA = pa.schema(
    [
        ("round", pa.int32()),
        ("pair_index", pa.int32()),
        ("labeller", pa.string()),
        ("verdict", pa.string()),
        ("a_side", pa.string()),
        ("labelled_at", pa.timestamp("us")),
    ]
)
Rows = Sequence[Any] | pa.Table | pd.DataFrame | None


@dataclass
class PhaseBatch:
    """Everything one (round, phase) commit appends, already as Arrow tables keyed by store table."""

    round: int
    phase: str
    tables: dict[str, pa.Table]
    num_agents: int | None = None
    # A judge's verdicts, committed with its label phase (they replace the same labellers' verdicts of the round).
    labels: pa.Table | None = None


def check_phase(phase: str) -> str:
    if phase not in ALL_PHASES:
        raise ValueError(f"phase must be one of {list(ALL_PHASES)}, got {phase!r}")
    return phase


def build_batch(
    round: int,
    phase: str,
    *,
    candidates: Rows = None,
    pairs: Rows = None,
    replay_rows: Rows = None,
    metrics: Rows = None,
    events: Rows = None,
    reward_distributions: Rows = None,
    labels: Sequence[Label] = (),
) -> PhaseBatch:
    """Validate one phase's records and turn them into Arrow tables (no database access)."""
    if not isinstance(round, int) or isinstance(round, bool) or round < 0:
        raise ValueError(f"round must be a non-negative int, got {round!r}")
    check_phase(phase)
    tables = {
        "candidates": _conform(candidates, CANDIDATE_SCHEMA, _candidate_columns),
        "pairs": _conform(pairs, PAIR_SCHEMA, lambda rows: _pair_columns(rows, round)),
        "replay": _conform(replay_rows, REPLAY_SCHEMA, _replay_columns),
        "metrics": _conform(metrics, METRIC_SCHEMA, _metric_columns),
        "events": _conform(events, EVENT_SCHEMA, _event_columns),
        "reward_distributions": _conform(reward_distributions, DISTRIBUTION_SCHEMA, _distribution_columns),
    }
    num_agents = None
    for name in ("pairs", "candidates"):
        if tables[name].num_rows:
            num_agents = int(pc.max(pc.list_value_length(tables[name]["prompts"])).as_py() or 0) or None
            break
    label_rows = label_table(labels) if labels else None
    return PhaseBatch(round=round, phase=phase, tables=tables, num_agents=num_agents, labels=label_rows)


def label_table(labels: Sequence[Label]) -> pa.Table:
    """Labels as the staged Arrow table; a verdict or shown side that is not one of the known values is refused."""
    for label in labels:
        check_verdict(label.verdict)
        check_side(label.a_side)
        if not str(label.labeller).strip():
            raise ValueError("a label needs a labeller name")
    now = utcnow()
    columns = {
        "round": [int(x.round) for x in labels],
        "pair_index": [int(x.pair_index) for x in labels],
        "labeller": [str(x.labeller).strip() for x in labels],
        "verdict": [x.verdict for x in labels],
        "a_side": [x.a_side for x in labels],
        "labelled_at": [x.labelled_at or now for x in labels],
    }
    return pa.table({f.name: pa.array(columns[f.name], type=f.type) for f in LABEL_SCHEMA}, schema=LABEL_SCHEMA)


def put_labels(con: duckdb.DuckDBPyConnection, run_id: str, rows: pa.Table, *, replace: bool) -> int:
    """Write labels in one transaction and return how many were written. ``replace``: a labeller's new verdict on a
    comparison replaces their earlier one (the labelling view); otherwise an existing verdict is kept and the new
    row skipped (an import never overwrites what was labelled)."""
    view = "_stage_labels"
    action = (
        "DO UPDATE SET verdict = excluded.verdict, a_side = excluded.a_side, labelled_at = excluded.labelled_at"
        if replace
        else "DO NOTHING"
    )
    con.register(view, rows)
    try:
        with _transaction(con):
            _ensure_run(con, run_id, utcnow())
            before = con.execute("SELECT count(*) FROM labels WHERE run_id = ?", [run_id]).fetchone()[0]
            con.execute(
                f"INSERT INTO labels BY NAME SELECT ?::VARCHAR AS run_id, * FROM {view} "
                f"ON CONFLICT (run_id, round, pair_index, labeller) {action}",
                [run_id],
            )
            after = con.execute("SELECT count(*) FROM labels WHERE run_id = ?", [run_id]).fetchone()[0]
    finally:
        con.unregister(view)
    return rows.num_rows if replace else int(after - before)


def delete_label(con: duckdb.DuckDBPyConnection, run_id: str, round: int, pair_index: int, labeller: str) -> None:
    """Remove one labeller's verdict on one comparison (undo in the labelling view)."""
    with _transaction(con):
        con.execute(
            "DELETE FROM labels WHERE run_id = ? AND round = ? AND pair_index = ? AND labeller = ?",
            [run_id, round, pair_index, labeller],
        )


@contextmanager
def _transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """One transaction: committed when the block ends, rolled back (and the error re-raised) when it raises."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def commit_batches(
    con: duckdb.DuckDBPyConnection,
    run_id: str,
    batches: Sequence[PhaseBatch],
    *,
    run_status: str | None = None,
    **run_fields: Any,
) -> None:
    """Commit several phases in ONE transaction: replace each phase's rows, mark it committed, update its round.

    ``run_fields`` (trainer, source, status, config_json) only fill a runs row created here; an existing run keeps
    its own. ``run_status`` sets the run's status whether or not the row is new (the engine's running/finished).
    """
    now = utcnow()
    with _transaction(con):
        _ensure_run(con, run_id, now, **run_fields)
        for batch in batches:
            key = [run_id, batch.round, batch.phase]
            for table in PHASE_TABLES:
                logged = " AND NOT logged" if table == "events" else ""  # the engine's log about the phase stays
                con.execute(f"DELETE FROM {table} WHERE run_id = ? AND round = ? AND phase = ?{logged}", key)
            for table, rows in batch.tables.items():
                if rows.num_rows:
                    _append(con, table, rows, key)
            if batch.labels is not None and batch.labels.num_rows:
                who = sorted(set(batch.labels["labeller"].to_pylist()))
                con.execute(
                    "DELETE FROM labels WHERE run_id = ? AND round = ? AND list_contains(?::VARCHAR[], labeller)",
                    [run_id, batch.round, who],
                )
                con.register("_stage_labels", batch.labels)
                try:
                    con.execute(
                        "INSERT INTO labels BY NAME SELECT ?::VARCHAR AS run_id, * FROM _stage_labels", [run_id]
                    )
                finally:
                    con.unregister("_stage_labels")
            if batch.tables["pairs"].num_rows:
                # Appending a round before a later one breaks the file order that lets exports skip their sort.
                con.execute(
                    "UPDATE runs SET pairs_in_order = false WHERE run_id = $1 AND pairs_in_order "
                    "AND EXISTS (SELECT 1 FROM pairs WHERE run_id = $1 AND round > $2)",
                    [run_id, batch.round],
                )
            con.execute(
                "INSERT INTO phases VALUES (?, ?, ?, ?) ON CONFLICT (run_id, round, phase) "
                "DO UPDATE SET committed_at = excluded.committed_at",
                [*key, now],
            )
            _update_round(con, run_id, batch.round, batch.phase, now)
            if batch.num_agents is not None:
                con.execute(
                    "UPDATE runs SET num_agents = coalesce(num_agents, ?) WHERE run_id = ?", [batch.num_agents, run_id]
                )
        con.execute("UPDATE runs SET updated_at = ? WHERE run_id = ?", [now, run_id])
        if run_status is not None:
            con.execute("UPDATE runs SET status = ? WHERE run_id = ?", [run_status, run_id])


def event_table(events: Rows) -> pa.Table:
    """Events as the staged Arrow table (for ``append_events``)."""
    return _conform(events, EVENT_SCHEMA, _event_columns)


def append_events(
    con: duckdb.DuckDBPyConnection, run_id: str, rows: pa.Table, round: int | None, phase: str | None = None
) -> None:
    """Append log events outside any phase commit (they are never replaced by one), tagged with round and phase."""
    rows = rows.append_column("logged", pa.array([True] * rows.num_rows, pa.bool_()))
    with _transaction(con):
        _ensure_run(con, run_id, utcnow())
        _append(con, "events", rows, [run_id, round, phase])


def append_phase_rows(
    con: duckdb.DuckDBPyConnection, run_id: str, table: str, rows: pa.Table, round: int, phase: str
) -> None:
    """Append rows to a phase's ``table`` without replacing the phase's other rows."""
    with _transaction(con):
        _append(con, table, rows, [run_id, round, check_phase(phase)])
        con.execute("UPDATE runs SET updated_at = ? WHERE run_id = ?", [utcnow(), run_id])


def insert_parquet(con: duckdb.DuckDBPyConnection, files: Mapping[str, Sequence[str]]) -> None:
    """Append each table's Parquet files (matched by column name) in one transaction."""
    with _transaction(con):
        for table, paths in files.items():
            if table not in TABLES:
                raise ValueError(f"unknown table {table!r}")
            con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM read_parquet(?)", [list(paths)])


def discard_after(con: duckdb.DuckDBPyConnection, run_id: str, round: int, phase: str | None) -> None:
    """Delete every phase committed after (round, phase) in one transaction; phase None keeps all of ``round``.

    A resume calls this with its checkpoint's position, so the store never holds rows the resumed run will redo.
    """
    later = list(ALL_PHASES[ALL_PHASES.index(check_phase(phase)) + 1 :]) if phase is not None else []
    cond = "run_id = ? AND (round > ? OR (round = ? AND list_contains(?::VARCHAR[], phase)))"
    args = [run_id, round, round, later]
    with _transaction(con):
        for table in (*PHASE_TABLES, "phases"):
            logged = " AND NOT logged" if table == "events" else ""  # the log keeps what happened
            con.execute(f"DELETE FROM {table} WHERE {cond}{logged}", args)
        con.execute("DELETE FROM rounds WHERE run_id = ? AND round > ?", [run_id, round])
        if later:
            resets = ", ".join(f"{p}_at = NULL" for p in later)
            con.execute(f"UPDATE rounds SET {resets} WHERE run_id = ? AND round = ?", [run_id, round])
            _refresh_round(con, run_id, round)


def upsert_run(con: duckdb.DuckDBPyConnection, run_id: str, **fields: Any) -> None:
    """Create a run or update the given fields of an existing one (trainer, status, source, num_agents, config_json)."""
    now = utcnow()
    with _transaction(con):
        _ensure_run(con, run_id, now, **fields)
        for name, value in fields.items():
            if value is not None:
                con.execute(f"UPDATE runs SET {name} = ? WHERE run_id = ?", [value, run_id])
        con.execute("UPDATE runs SET updated_at = ? WHERE run_id = ?", [now, run_id])


RUN_FIELDS = ("trainer", "status", "source", "num_agents", "config_json")


def _ensure_run(con: duckdb.DuckDBPyConnection, run_id: str, now: Any, **fields: Any) -> None:
    unknown = set(fields) - set(RUN_FIELDS)
    if unknown:
        raise ValueError(f"unknown run field(s) {sorted(unknown)}; expected some of {list(RUN_FIELDS)}")
    if not isinstance(run_id, str) or not run_id:
        raise ValueError(f"run_id must be a non-empty string, got {run_id!r}")
    con.execute(
        "INSERT INTO runs (run_id, created_at, updated_at, trainer, status, source, num_agents, config_json) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO NOTHING",
        [
            run_id,
            now,
            now,
            fields.get("trainer"),
            fields.get("status") or "running",
            fields.get("source") or "engine",
            fields.get("num_agents"),
            fields.get("config_json"),
        ],
    )


def _append(con: duckdb.DuckDBPyConnection, table: str, rows: pa.Table, key: list[Any]) -> None:
    view = f"_stage_{table}"
    con.register(view, rows)
    try:
        con.execute(
            f"INSERT INTO {table} BY NAME "
            f"SELECT ?::VARCHAR AS run_id, ?::INTEGER AS round, ?::VARCHAR AS phase, * FROM {view}",
            key,
        )
    finally:
        con.unregister(view)


def _update_round(con: duckdb.DuckDBPyConnection, run_id: str, round: int, phase: str, now: Any) -> None:
    con.execute(
        f"INSERT INTO rounds (run_id, round, status, {phase}_at) VALUES (?, ?, ?, ?) "
        f"ON CONFLICT (run_id, round) DO UPDATE SET {phase}_at = excluded.{phase}_at",
        [run_id, round, phase, now],
    )
    _refresh_round(con, run_id, round)


def _refresh_round(con: duckdb.DuckDBPyConnection, run_id: str, round: int) -> None:
    con.execute(
        """
        UPDATE rounds SET
            status = coalesce((SELECT phase FROM phases WHERE run_id = $1 AND round = $2
                               ORDER BY list_position($3::VARCHAR[], phase) DESC LIMIT 1), 'none'),
            num_candidates = (SELECT count(*) FROM candidates WHERE run_id = $1 AND round = $2),
            num_pairs = (SELECT count(*) FROM pairs WHERE run_id = $1 AND round = $2),
            num_drawn = (SELECT coalesce(sum(drawn_count), 0) FROM replay WHERE run_id = $1 AND round = $2)
        WHERE run_id = $1 AND round = $2
        """,
        [run_id, round, list(ALL_PHASES)],
    )


# ----------------------------------------------------------------------------------------------------------------
# Records -> Arrow columns


def _conform(rows: Rows, schema: pa.Schema, to_columns: Any) -> pa.Table:
    """Turn records, a DataFrame or an Arrow table into a table with exactly ``schema``'s columns."""
    if rows is None:
        return schema.empty_table()
    if isinstance(rows, pd.DataFrame):
        rows = pa.Table.from_pandas(rows, preserve_index=False)
    if isinstance(rows, pa.Table):
        return _conform_table(rows, schema)
    rows = list(rows)
    if not rows:
        return schema.empty_table()
    columns = to_columns(rows)
    return pa.table({f.name: pa.array(columns[f.name], type=f.type) for f in schema}, schema=schema)


_REQUIRED_COLUMNS = frozenset(
    {"prompts", "completions", "winner_completions", "loser_completions", "winner_reward", "loser_reward",
     "candidate_reward_mean", "side", "name", "source_round", "mode", "weight", "drawn_count", "message"}
)  # fmt: skip


def _conform_table(table: pa.Table, schema: pa.Schema) -> pa.Table:
    n = table.num_rows
    for column, allowed in (("winner_side", WINNER_SIDES), ("side", CANDIDATE_SIDES)):
        if column in table.column_names and column in schema.names:
            values = table[column].cast(pa.string())
            bad = pc.filter(values, pc.and_(pc.is_valid(values), pc.invert(pc.is_in(values, pa.array(allowed)))))
            if len(bad):
                raise ValueError(f"{column} must be one of {list(allowed)}, got {bad[0].as_py()!r}")
    if "pair_index" in table.column_names and n > 1:
        index = table["pair_index"]
        if pc.count_distinct(index).as_py() != n or index.null_count:
            raise ValueError("pair_index must hold distinct, non-null values")
        if not pc.all(pc.greater(index.slice(1), index.slice(0, n - 1))).as_py():
            table = table.sort_by("pair_index")  # rows are stored in round order, as the round file lists them
    arrays = []
    for f in schema:
        if f.name in table.column_names:
            arrays.append(table[f.name].cast(f.type))
        elif f.name == "pair_index":
            arrays.append(pa.array(range(n), type=f.type))
        elif f.name == "reward_gap":
            arrays.append(pc.subtract(table["winner_reward"], table["loser_reward"]).cast(f.type))
        elif f.name == "ts":
            arrays.append(pa.array([utcnow()] * n, type=f.type))
        elif f.name in _REQUIRED_COLUMNS:
            raise ValueError(f"a table of records needs the column '{f.name}' (columns: {schema.names})")
        else:
            arrays.append(pa.nulls(n, type=f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _counts(ids: list[list[int]] | None) -> list[int] | None:
    return None if ids is None else [len(x) for x in ids]


def _candidate_columns(rows: list[JointCandidate]) -> dict[str, list[Any]]:
    for c in rows:
        if not isinstance(c, JointCandidate):
            raise TypeError(f"candidates must be JointCandidate objects, got {type(c).__name__}")
        if c.side not in CANDIDATE_SIDES:
            raise ValueError(f"candidate side must be one of {list(CANDIDATE_SIDES)}, got {c.side!r}")
    return {
        "item_index": [c.item_index for c in rows],
        "side": [c.side for c in rows],
        "candidate_index": [c.candidate_index for c in rows],
        "prompts": [list(c.prompts) for c in rows],
        "completions": [list(c.completions) for c in rows],
        "prompt_token_counts": [_counts(c.prompt_ids) for c in rows],
        "token_counts": [_counts(c.completion_ids) for c in rows],
        "raw_reward": [_float_or_none(c.raw_reward) for c in rows],
        "reward": [_float_or_none(c.reward) for c in rows],
        "parse_status": [c.parse_status for c in rows],
        "details_json": [_json_or_none(c.details) for c in rows],
    }


def _pair_columns(rows: list[PreferencePair], round: int) -> dict[str, list[Any]]:
    for i, p in enumerate(rows):
        if not isinstance(p, PreferencePair):
            raise TypeError(f"pairs must be PreferencePair objects, got {type(p).__name__}")
        if p.round_index is not None and p.round_index != round:
            raise ValueError(f"pair {i} has round_index {p.round_index} but is committed to round {round}")
        if p.winner_side is not None and p.winner_side not in WINNER_SIDES:
            raise ValueError(
                f"pair {i}: winner_side must be one of {list(WINNER_SIDES)} or None, got {p.winner_side!r}"
            )
    return {
        "pair_index": list(range(len(rows))),
        "item_index": [p.item_index for p in rows],
        "winner_candidate_index": [p.winner_candidate_index for p in rows],
        "loser_candidate_index": [p.loser_candidate_index for p in rows],
        "winner_side": [p.winner_side for p in rows],
        "prompts": [list(p.prompts) for p in rows],
        "winner_completions": [list(p.winner_completions) for p in rows],
        "loser_completions": [list(p.loser_completions) for p in rows],
        "winner_reward": [float(p.winner_reward) for p in rows],
        "loser_reward": [float(p.loser_reward) for p in rows],
        "candidate_reward_mean": [float(p.candidate_reward_mean) for p in rows],
        "raw_rewards": [None if p.raw_rewards is None else [float(x) for x in p.raw_rewards] for p in rows],
        "target_raw_reward": [_float_or_none(p.target_raw_reward) for p in rows],
        "comparator_raw_reward": [_float_or_none(p.comparator_raw_reward) for p in rows],
        "reward_gap": [p.reward_gap for p in rows],
        "winner_token_counts": [_counts(p.winner_ids) for p in rows],
        "loser_token_counts": [_counts(p.loser_ids) for p in rows],
        "extra_json": [json.dumps(p.extra, default=str) if p.extra else None for p in rows],
    }


def _replay_columns(rows: list[Mapping[str, Any]]) -> dict[str, list[Any]]:
    required = ("source_round", "mode", "weight", "drawn_count")
    for i, r in enumerate(rows):
        missing = [k for k in required if k not in r]
        if missing:
            raise ValueError(
                f"replay row {i} lacks {missing}; a replay row has {list(required)} and optional num_pairs"
            )
    return {
        "source_round": [int(r["source_round"]) for r in rows],
        "mode": [str(r["mode"]) for r in rows],
        "weight": [float(r["weight"]) for r in rows],
        "drawn_count": [int(r["drawn_count"]) for r in rows],
        "num_pairs": [None if r.get("num_pairs") is None else int(r["num_pairs"]) for r in rows],
    }


def _distribution_columns(rows: list[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Rows as ``data.reward_distribution.distribution_rows`` makes them."""
    return {
        "series": [str(r["series"]) for r in rows],
        "side": [str(r["side"]) for r in rows],
        "reward_min": [float(r["reward_min"]) for r in rows],
        "reward_max": [float(r["reward_max"]) for r in rows],
        "bin_edges": [[float(e) for e in r["bin_edges"]] for r in rows],
        "counts": [[int(c) for c in r["counts"]] for r in rows],
        "sample_count": [int(r["sample_count"]) for r in rows],
        "mean": [_float_or_none(r.get("mean")) for r in rows],
        "raw_rewards": [[float(v) for v in r.get("raw_rewards") or ()] for r in rows],
    }


def _metric_columns(rows: Iterable[Any]) -> dict[str, list[Any]]:
    steps, names, values = [], [], []
    for r in rows:
        if isinstance(r, Mapping):
            step, name, value = r.get("step", 0), r["name"], r["value"]
        elif isinstance(r, (tuple, list)) and len(r) in (2, 3):
            step, name, value = (0, *r) if len(r) == 2 else r
        else:
            raise ValueError(
                f"a metric is {{'step', 'name', 'value'}}, (name, value) or (step, name, value); got {r!r}"
            )
        steps.append(int(step))
        names.append(str(name))
        values.append(_float_or_none(value))
    return {"step": steps, "name": names, "value": values}


def _event_columns(rows: Iterable[Any]) -> dict[str, list[Any]]:
    ts, levels, messages, tracebacks = [], [], [], []
    for r in rows:
        if not isinstance(r, Mapping) or "message" not in r:
            raise ValueError(f"an event is a mapping with 'message' and optional 'level', 'traceback'; got {r!r}")
        ts.append(r.get("ts") or utcnow())
        levels.append(str(r.get("level", "info")))
        messages.append(str(r["message"]))
        tracebacks.append(r.get("traceback"))
    return {"ts": ts, "level": levels, "message": messages, "traceback": tracebacks}


def _json_or_none(value: dict[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, default=str)


def _float_or_none(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return x if not math.isnan(x) else None
