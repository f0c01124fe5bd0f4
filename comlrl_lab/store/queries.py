"""Named read queries for the UI and exports: each takes a cursor and returns a pandas DataFrame (or a dict).

Filters become bound parameters, never string formatting. This module does not write (``writer``) and does not run
user SQL (``sql_guard``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import duckdb
import pandas as pd

from comlrl_lab.data.labels import Label
from comlrl_lab.data.records import SEED_RECORD_FIELDS, PreferencePair
from comlrl_lab.names import metric_names
from comlrl_lab.store.schema import ALL_PHASES

#: Columns a pairs page shows (the long texts are included: a page is 50 rows).
PAGE_COLUMNS = (
    "round",
    "pair_index",
    "item_index",
    "winner_side",
    "winner_candidate_index",
    "loser_candidate_index",
    "winner_reward",
    "loser_reward",
    "reward_gap",
    "candidate_reward_mean",
    "target_raw_reward",
    "comparator_raw_reward",
    "prompts",
    "winner_completions",
    "loser_completions",
)

PROVENANCE_COLUMNS = (
    "round",
    "pair_index",
    "item_index",
    "winner_candidate_index",
    "loser_candidate_index",
    "winner_side",
    "reward_gap",
)


@dataclass(frozen=True)
class PairFilter:
    """The pair browser's filters; None means "any". ``text`` matches prompts and both completions, any case."""

    round: int | None = None
    item: int | None = None
    winner_side: str | None = None
    min_gap: float | None = None
    max_gap: float | None = None
    text: str | None = None

    def where(self, run_id: str) -> tuple[str, list[Any]]:
        """A WHERE clause (without the keyword) and its parameters."""
        clauses, args = ["run_id = ?"], [run_id]
        if self.round is not None:
            clauses.append("round = ?")
            args.append(int(self.round))
        if self.item is not None:
            clauses.append("item_index = ?")
            args.append(int(self.item))
        if self.winner_side is not None:
            clauses.append("winner_side = ?")
            args.append(str(self.winner_side))
        if self.min_gap is not None:
            clauses.append("reward_gap >= ?")
            args.append(float(self.min_gap))
        if self.max_gap is not None:
            clauses.append("reward_gap <= ?")
            args.append(float(self.max_gap))
        if self.text:
            clauses.append(
                "(list_bool_or([contains(lower(x), ?) FOR x IN prompts]) "
                "OR list_bool_or([contains(lower(x), ?) FOR x IN winner_completions]) "
                "OR list_bool_or([contains(lower(x), ?) FOR x IN loser_completions]))"
            )
            args.extend([self.text.lower()] * 3)
        return " AND ".join(clauses), args


FILTER_KEYS = ("round", "item", "winner_side", "min_gap", "max_gap", "text")


def pair_filter(**filters: Any) -> PairFilter:
    unknown = set(filters) - set(FILTER_KEYS)
    if unknown:
        raise ValueError(f"unknown pair filter(s) {sorted(unknown)}; expected some of {list(FILTER_KEYS)}")
    return PairFilter(**filters)


def list_runs(cur: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    return cur.execute(
        """
        SELECT r.run_id, r.trainer, r.status, r.source, r.num_agents, r.created_at, r.updated_at,
               coalesce(max(x.round), 0) AS num_rounds, coalesce(sum(x.num_pairs), 0)::BIGINT AS num_pairs
        FROM runs r LEFT JOIN rounds x USING (run_id)
        GROUP BY ALL ORDER BY r.created_at, r.run_id
        """
    ).df()


def first_run_id(cur: duckdb.DuckDBPyConnection) -> str | None:
    row = cur.execute("SELECT run_id FROM runs ORDER BY created_at, run_id LIMIT 1").fetchone()
    return None if row is None else str(row[0])


def trained_run_ids(cur: duckdb.DuckDBPyConnection) -> list[str]:
    """Runs of the store that were not imported (a training run's own store holds one)."""
    rows = cur.execute("SELECT run_id FROM runs WHERE source <> 'import' ORDER BY created_at, run_id").fetchall()
    return [str(row[0]) for row in rows]


def run_info(cur: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any] | None:
    df = cur.execute("SELECT * FROM runs WHERE run_id = ?", [run_id]).df()
    return None if df.empty else df.iloc[0].to_dict()


def rounds(cur: duckdb.DuckDBPyConnection, run_id: str) -> pd.DataFrame:
    """One row per round; ``num_candidates`` counts the collected candidates, ``num_eval_samples`` the evaluation's."""
    return cur.execute(
        """
        SELECT r.* EXCLUDE (run_id, num_candidates),
               coalesce(c.collected, 0) AS num_candidates, coalesce(c.evaluated, 0) AS num_eval_samples
        FROM rounds r
        LEFT JOIN (SELECT round, count(*) FILTER (WHERE side <> 'eval') AS collected,
                          count(*) FILTER (WHERE side = 'eval') AS evaluated
                   FROM candidates WHERE run_id = $1 GROUP BY round) c USING (round)
        WHERE r.run_id = $1 ORDER BY round
        """,
        [run_id],
    ).df()


def rounds_without_pairs(cur: duckdb.DuckDBPyConnection, run_id: str) -> pd.DataFrame:
    """Collected rounds that produced no preference pair: round, candidates, nan_rewards (candidates whose reward is
    NaN, the usual cause besides ties)."""
    return cur.execute(
        """
        SELECT r.round, count(c.round) AS candidates, count(c.round) FILTER (WHERE c.reward IS NULL OR isnan(c.reward)) AS nan_rewards
        FROM rounds r
        LEFT JOIN candidates c ON c.run_id = r.run_id AND c.round = r.round AND c.side <> 'eval'
        WHERE r.run_id = ? AND r.collect_at IS NOT NULL AND r.num_pairs = 0
        GROUP BY r.round ORDER BY r.round
        """,
        [run_id],
    ).df()


def committed_phases(cur: duckdb.DuckDBPyConnection, run_id: str) -> list[tuple[int, str]]:
    """(round, phase) of every committed phase, in run order."""
    rows = cur.execute(
        "SELECT round, phase FROM phases WHERE run_id = ? ORDER BY round, list_position(?::VARCHAR[], phase)",
        [run_id, list(ALL_PHASES)],
    ).fetchall()
    return [(int(r), str(p)) for r, p in rows]


def pairs_page(
    cur: duckdb.DuckDBPyConnection, run_id: str, flt: PairFilter, *, limit: int = 50, offset: int = 0
) -> pd.DataFrame:
    where, args = flt.where(run_id)
    cols = ", ".join(PAGE_COLUMNS)
    return cur.execute(
        f"SELECT {cols} FROM pairs WHERE {where} ORDER BY round, pair_index LIMIT ? OFFSET ?",
        [*args, int(limit), int(offset)],
    ).df()


def pairs_count(cur: duckdb.DuckDBPyConnection, run_id: str, flt: PairFilter) -> int:
    where, args = flt.where(run_id)
    return int(cur.execute(f"SELECT count(*) FROM pairs WHERE {where}", args).fetchone()[0])


def pair_position(
    cur: duckdb.DuckDBPyConnection, run_id: str, flt: PairFilter, round: int, pair_index: int
) -> int | None:
    """Where pair (``round``, ``pair_index``) sits, from 0, among the pairs ``flt`` matches in ``pairs_page``'s order;
    None when it is not one of them."""
    where, args = flt.where(run_id)
    row = cur.execute(
        f"SELECT count(*) FILTER (WHERE (round, pair_index) < (?, ?)), "
        f"count(*) FILTER (WHERE round = ? AND pair_index = ?) FROM pairs WHERE {where}",
        [int(round), int(pair_index), int(round), int(pair_index), *args],
    ).fetchone()
    return int(row[0]) if row[1] else None


def pair_detail(cur: duckdb.DuckDBPyConnection, run_id: str, round: int, pair_index: int) -> dict[str, Any] | None:
    """Every stored field of one pair, plus ``record`` (the seed JSON record) and ``winner_details`` and
    ``loser_details``: the breakdowns the task reward gave the two candidates (None where it gave none)."""
    result = cur.execute(
        "SELECT * EXCLUDE (run_id) FROM pairs WHERE run_id = ? AND round = ? AND pair_index = ?",
        [run_id, int(round), int(pair_index)],
    )
    values = result.fetchone()
    if values is None:
        return None
    row = dict(zip([d[0] for d in result.description], values))
    row["record"] = _row_to_pair(row).to_record()
    row["winner_details"], row["loser_details"] = _pair_breakdowns(cur, run_id, row)
    return row


#: The side the loser of a pair was sampled on, by its winner's side; pairs of the base trainers (winner_side None)
#: are between two current candidates.
_LOSER_SIDE = {"current": "comparator", "comparator": "current", None: "current"}


def _pair_breakdowns(
    cur: duckdb.DuckDBPyConnection, run_id: str, row: dict[str, Any]
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The stored breakdowns of a pair's winner and loser candidates (collect phase), found by item, side and index."""
    item, winner_side = row.get("item_index"), row.get("winner_side")
    if item is None or winner_side not in _LOSER_SIDE:
        return None, None
    found = {
        (str(side), int(index)): json.loads(text)
        for side, index, text in cur.execute(
            "SELECT side, candidate_index, details_json FROM candidates WHERE run_id = ? AND round = ? "
            "AND phase = 'collect' AND item_index = ? AND details_json IS NOT NULL",
            [run_id, int(row["round"]), int(item)],
        ).fetchall()
    }

    def lookup(side: str, index: Any) -> dict[str, Any] | None:
        return None if index is None else found.get((side, int(index)))

    return (
        lookup(winner_side or "current", row.get("winner_candidate_index")),
        lookup(_LOSER_SIDE[winner_side], row.get("loser_candidate_index")),
    )


def candidates_for_item(cur: duckdb.DuckDBPyConnection, run_id: str, round: int, item: int) -> pd.DataFrame:
    return cur.execute(
        "SELECT * EXCLUDE (run_id) FROM candidates WHERE run_id = ? AND round = ? AND item_index = ? "
        "ORDER BY side DESC, candidate_index",
        [run_id, int(round), int(item)],
    ).df()


def metrics(cur: duckdb.DuckDBPyConnection, run_id: str, names: list[str] | None = None) -> pd.DataFrame:
    """Long format: round, phase, step, name, value; ``names`` entries ending in '/' match a prefix."""
    sql = "SELECT round, phase, step, name, value FROM metrics WHERE run_id = ?"
    args: list[Any] = [run_id]
    if names:
        exact = [n for n in names if not n.endswith("/")]
        prefixes = [n for n in names if n.endswith("/")]
        sql += " AND (list_contains(?::VARCHAR[], name) OR list_bool_or([starts_with(name, p) FOR p IN ?::VARCHAR[]]))"
        args += [exact, prefixes]
    return cur.execute(sql + " ORDER BY round, step, name", args).df()


def replay(cur: duckdb.DuckDBPyConnection, run_id: str) -> pd.DataFrame:
    return cur.execute(
        "SELECT round, source_round, mode, weight, drawn_count, num_pairs FROM replay WHERE run_id = ? "
        "ORDER BY round, source_round",
        [run_id],
    ).df()


def reward_distributions(cur: duckdb.DuckDBPyConnection, run_id: str, round: int) -> pd.DataFrame:
    """Rewards of one round in long form: series 'candidate' (every scored candidate, by side) and 'selected'
    (the current and comparator raw rewards of the round's pairs), as CoMLRL's reward_distributions files split them.
    """
    return cur.execute(
        """
        SELECT 'candidate' AS series, side, raw_reward, reward FROM candidates
        WHERE run_id = $1 AND round = $2 AND parse_status = 'ok' AND side IN ('current', 'comparator')
        UNION ALL
        SELECT 'selected', 'current', target_raw_reward, NULL FROM pairs
        WHERE run_id = $1 AND round = $2 AND target_raw_reward IS NOT NULL
        UNION ALL
        SELECT 'selected', 'comparator', comparator_raw_reward, NULL FROM pairs
        WHERE run_id = $1 AND round = $2 AND comparator_raw_reward IS NOT NULL
        """,
        [run_id, int(round)],
    ).df()


def binned_reward_distributions(cur: duckdb.DuckDBPyConnection, run_id: str, round: int | None = None) -> pd.DataFrame:
    """The histograms a run with log_reward_distribution logged: one row per (round, series, side), every round
    or one, in (round, series, side) order; empty for other runs."""
    where, args = ("run_id = $1", [run_id]) if round is None else ("run_id = $1 AND round = $2", [run_id, int(round)])
    return cur.execute(
        "SELECT round, series, side, reward_min, reward_max, bin_edges, counts, sample_count, mean, raw_rewards "
        f"FROM reward_distributions WHERE {where} ORDER BY round, series, side DESC",
        args,
    ).df()


def eval_curve(cur: duckdb.DuckDBPyConnection, run_id: str, prefix: str = metric_names.EVAL_PREFIX) -> pd.DataFrame:
    """One row per (round, metric) of the evaluate phase (or any metric named ``prefix``...), averaged over steps."""
    return cur.execute(
        "SELECT round, name, avg(value) AS value FROM metrics WHERE run_id = ? AND (phase = 'evaluate' OR "
        "starts_with(name, ?)) GROUP BY round, name ORDER BY round, name",
        [run_id, prefix],
    ).df()


def events(cur: duckdb.DuckDBPyConnection, run_id: str, *, level: str | None = None, limit: int = 500) -> pd.DataFrame:
    sql = "SELECT ts, round, phase, level, message, traceback FROM events WHERE run_id = ?"
    args: list[Any] = [run_id]
    if level is not None:
        sql += " AND level = ?"
        args.append(level)
    return cur.execute(sql + " ORDER BY ts DESC LIMIT ?", [*args, int(limit)]).df()


def load_pairs(cur: duckdb.DuckDBPyConnection, run_id: str, flt: PairFilter) -> list[PreferencePair]:
    """Stored pairs as ``PreferencePair`` objects (texts and rewards; token ids live in checkpoints, not here)."""
    where, args = flt.where(run_id)
    cols = ", ".join(dict.fromkeys((*PROVENANCE_COLUMNS, *SEED_RECORD_FIELDS, "extra_json")))
    rows = cur.execute(f"SELECT {cols} FROM pairs WHERE {where} ORDER BY round, pair_index", args).fetchall()
    names = [d[0] for d in cur.description]
    return [_row_to_pair(dict(zip(names, r))) for r in rows]


def _row_to_pair(row: dict[str, Any]) -> PreferencePair:
    def opt_int(v: Any) -> int | None:
        return None if v is None else int(v)

    raw = row.get("raw_rewards")
    return PreferencePair(
        prompts=list(row["prompts"]),
        winner_completions=list(row["winner_completions"]),
        loser_completions=list(row["loser_completions"]),
        winner_reward=float(row["winner_reward"]),
        loser_reward=float(row["loser_reward"]),
        candidate_reward_mean=float(row["candidate_reward_mean"]),
        raw_rewards=None if raw is None or len(raw) == 0 else [float(x) for x in raw],
        target_raw_reward=_opt_float(row.get("target_raw_reward")),
        comparator_raw_reward=_opt_float(row.get("comparator_raw_reward")),
        round_index=opt_int(row.get("round")),
        item_index=opt_int(row.get("item_index")),
        winner_candidate_index=opt_int(row.get("winner_candidate_index")),
        loser_candidate_index=opt_int(row.get("loser_candidate_index")),
        winner_side=row.get("winner_side"),
        extra=json.loads(row["extra_json"]) if row.get("extra_json") else {},
    )


def labels(cur: duckdb.DuckDBPyConnection, run_id: str, round: int | None = None) -> list[Label]:
    """The run's labels (of one round, or all), in (round, pair_index, labelled_at) order."""
    where, args = ("run_id = ?", [run_id]) if round is None else ("run_id = ? AND round = ?", [run_id, round])
    rows = cur.execute(
        "SELECT round, pair_index, labeller, verdict, a_side, labelled_at FROM labels "
        f"WHERE {where} ORDER BY round, pair_index, labelled_at, labeller",
        args,
    ).fetchall()
    return [Label(int(r), int(i), str(who), str(v), str(a), at) for r, i, who, v, a, at in rows]


def _opt_float(v: Any) -> float | None:
    if v is None:
        return None
    try:
        if pd.isna(v):
            return None
    except (TypeError, ValueError):
        pass
    return float(v)
