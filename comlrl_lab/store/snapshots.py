"""Reads many runs at once from their Parquet ``snapshots/`` folders: the Compare page's and notebooks' source.

A run's DuckDB file may be held read-write by this process (a run being stepped) or by another one, and DuckDB
then refuses every other connection to it; the snapshot the engine writes after every phase can always be read.
Each function runs one query over the files of every run it is given, in an in-memory DuckDB connection of its
own (so it is safe from any thread). Runs without a snapshot of a table are skipped, and so are files that are no
Parquet (a crash, a bad copy): the query runs again without them, and ``frame.attrs["unreadable"]`` lists them, so
a page says which run to reopen (opening a run writes such files again). It never writes.
Files of one table share one schema (one writer), so no ``union_by_name``, which reads every file's footer first.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import duckdb
import pandas as pd

from comlrl_lab.store.export import is_parquet

METRIC_COLUMNS = ["run_id", "round", "phase", "name", "value"]
PAIR_COLUMNS = ["run_id", "round", "winner_side", "reward_gap", "winner_tokens", "loser_tokens"]


def _files(snapshot_dirs: Sequence[str | os.PathLike[str]], table: str, phases: Sequence[str] = ()) -> list[str]:
    """Glob patterns of ``table``'s files (only those of ``phases`` when given) that match at least one file."""
    names = [f"round_*_{phase}.parquet" for phase in phases] or ["*.parquet"]
    # DuckDB fails on a pattern that matches nothing; every file it opens costs about a millisecond.
    return [str(Path(d) / table / n) for d in snapshot_dirs for n in names if any((Path(d) / table).glob(n))]


def round_metrics(
    snapshot_dirs: Sequence[str | os.PathLike[str]], names: Sequence[str], phases: Sequence[str] = ()
) -> pd.DataFrame:
    """One row per (run, round, phase, metric name) among ``names``: the mean of the values recorded there.

    A metric logged once per round (``eval/...``, ``round/...``, ``collect/...``) comes back as it was logged.
    With ``phases``, only those phases' files are read.
    """
    files = _files(snapshot_dirs, "metrics", phases)
    if not files or not names:
        return pd.DataFrame(columns=METRIC_COLUMNS)
    sql = """
        SELECT run_id, round, phase, name, avg(value) AS value
        FROM read_parquet(?)
        WHERE name IN (SELECT unnest(?::VARCHAR[])) AND round IS NOT NULL AND value IS NOT NULL
        GROUP BY run_id, round, phase, name
        ORDER BY run_id, round, name
    """
    return _query(sql, files, [list(names)], METRIC_COLUMNS)


def pair_rows(snapshot_dirs: Sequence[str | os.PathLike[str]]) -> pd.DataFrame:
    """Every pair of every run, reduced to what pair statistics need: side, gap and total tokens of each side."""
    files = _files(snapshot_dirs, "pairs", ["collect"])
    if not files:
        return pd.DataFrame(columns=PAIR_COLUMNS)
    sql = """
        SELECT run_id, round, coalesce(winner_side, 'n/a') AS winner_side, reward_gap,
               list_sum(winner_token_counts) AS winner_tokens, list_sum(loser_token_counts) AS loser_tokens
        FROM read_parquet(?)
        ORDER BY run_id, round
    """
    return _query(sql, files, [], PAIR_COLUMNS)


def _query(sql: str, files: list[str], args: list, columns: list[str]) -> pd.DataFrame:
    """``sql`` over ``files`` (its first parameter); when some file is no Parquet, again over the readable ones."""
    with duckdb.connect() as con:
        try:
            frame = con.execute(sql, [files, *args]).df()
            frame.attrs["unreadable"] = []
            return frame
        except duckdb.Error:
            pass  # which file it was: find out below, one footer at a time
        matched = sorted({str(p) for pattern in files for p in Path(pattern).parent.glob(Path(pattern).name)})
        bad = [path for path in matched if not is_parquet(Path(path))]
        good = [path for path in matched if path not in bad]
        frame = con.execute(sql, [good, *args]).df() if good else pd.DataFrame(columns=columns)
    frame.attrs["unreadable"] = bad
    return frame


def run_statuses(snapshot_dirs: Sequence[str | os.PathLike[str]]) -> dict[str, str]:
    """Each run's ``runs.status`` as its snapshot last recorded it (created, running, failed, finished), by run id.

    Runs without a snapshot yet (no phase committed) are left out.
    """
    files = [str(Path(d) / "runs.parquet") for d in snapshot_dirs if (Path(d) / "runs.parquet").is_file()]
    if not files:
        return {}
    with duckdb.connect() as con:
        return dict(con.execute("SELECT run_id, status FROM read_parquet(?)", [files]).fetchall())
