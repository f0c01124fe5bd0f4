"""``RunStore``: one DuckDB file per run directory, opened once per process, safe to read from many threads.

The store holds one read-write connection. Writes (one transaction per phase, ``writer``) go through it under a
lock; reads go through a per-thread ``cursor()`` (DuckDB's recipe for threads), so the UI reads committed data
while the engine thread writes. Methods are thin: the SQL lives in ``schema``, ``writer``, ``queries`` and
``sql_guard``. Exports, Parquet snapshots and imports are functions over a store (``export``, ``importer``), so
this class does not know them. It does not train, checkpoint or know Streamlit.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

from comlrl_lab.data.labels import Label
from comlrl_lab.data.records import PreferencePair
from comlrl_lab.store import queries, schema, sql_guard, writer


class RunStore:
    """The DuckDB store of one run directory.

    ``RunStore(path)`` creates or migrates the file; ``RunStore(path, read_only=True)`` opens an existing one for
    reading only. While one process holds the file read-write, no other process can open it at all: hand data to
    other processes through ``export.snapshot_parquet`` or the exports.
    """

    def __init__(self, path: str | os.PathLike[str], read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = bool(read_only)
        if read_only and not self.path.exists():
            raise FileNotFoundError(f"no store at {str(self.path)!r}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._con: duckdb.DuckDBPyConnection | None = duckdb.connect(str(self.path), read_only=self.read_only)
        self._lock = threading.RLock()
        self._cursor_lock = threading.Lock()
        self._local = threading.local()
        self._cursors: dict[threading.Thread, duckdb.DuckDBPyConnection] = {}
        try:
            # Readers never see Python variables as tables; the writer registers its frames by name instead.
            self._con.execute("SET python_enable_replacements = false")
            schema.ensure_schema(self._con, read_only=self.read_only)
        except BaseException:
            self._con.close()
            self._con = None
            raise

    # -- connection handling -------------------------------------------------------------------------------------

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """This thread's read cursor (created on first use, closed with the store)."""
        cur = getattr(self._local, "cursor", None)
        if cur is None:
            with self._cursor_lock:  # not the write lock: a long commit must not hold up the UI's reads
                # Streamlit runs each rerun in a new thread: close the cursors of threads that have ended.
                for thread in [t for t in self._cursors if not t.is_alive()]:
                    with contextlib.suppress(duckdb.Error):
                        self._cursors.pop(thread).close()
                cur = self._connection().cursor()
                self._cursors[threading.current_thread()] = cur
            self._local.cursor = cur
        return cur

    def close(self) -> None:
        with self._lock, self._cursor_lock:
            for cur in self._cursors.values():
                with contextlib.suppress(duckdb.Error):
                    cur.close()
            self._cursors.clear()
            self._local = threading.local()
            if self._con is not None:
                self._con.close()
                self._con = None

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RunStore({str(self.path)!r}, read_only={self.read_only})"

    def _connection(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            raise RuntimeError(f"the store {str(self.path)!r} is closed")
        return self._con

    def _writable(self) -> duckdb.DuckDBPyConnection:
        if self.read_only:
            raise PermissionError(f"the store {str(self.path)!r} is open read-only")
        return self._connection()

    # -- writes ---------------------------------------------------------------------------------------------------

    def create_run(
        self,
        run_id: str,
        *,
        trainer: str | None = None,
        config: dict[str, Any] | None = None,
        num_agents: int | None = None,
        status: str = "created",
        source: str = "engine",
    ) -> None:
        """Create the run, or update the given fields of an existing one."""
        config_json = json.dumps(config, default=str, sort_keys=True) if config is not None else None
        with self._lock:
            writer.upsert_run(
                self._writable(),
                run_id,
                trainer=trainer,
                status=status,
                source=source,
                num_agents=num_agents,
                config_json=config_json,
            )

    def commit_phase(
        self,
        run_id: str,
        round: int,
        phase: str,
        *,
        candidates: writer.Rows = None,
        pairs: writer.Rows = None,
        replay_rows: writer.Rows = None,
        metrics: writer.Rows = None,
        events: writer.Rows = None,
        reward_distributions: writer.Rows = None,
        labels: Sequence[Label] = (),
        status: str | None = None,
    ) -> None:
        """Commit one finished phase in ONE transaction; committing it again replaces its rows (never duplicates).

        ``candidates``: ``JointCandidate``s; ``pairs``: ``PreferencePair``s in their round-file order (or an Arrow
        table / DataFrame with the pairs columns); ``replay_rows``: dicts with source_round, mode, weight,
        drawn_count (and optional num_pairs); ``metrics``: dicts with step, name, value; ``events``: dicts with
        level, message (and optional traceback); ``reward_distributions``: ``distribution_rows`` dicts; ``labels``: a
        judge's verdicts, which replace its earlier ones of the round. Token ids are not stored here (checkpoints hold
        them); their counts are. ``status``, when given, becomes the run's status in the same transaction.
        """
        batch = writer.build_batch(
            round,
            phase,
            candidates=candidates,
            pairs=pairs,
            replay_rows=replay_rows,
            metrics=metrics,
            events=events,
            reward_distributions=reward_distributions,
            labels=labels,
        )
        with self._lock:
            writer.commit_batches(self._writable(), run_id, [batch], run_status=status)

    def put_labels(self, run_id: str, labels: Sequence[Label], *, replace: bool = True) -> int:
        """Write labels now, in one transaction (a verdict is committed as it is given); see ``writer.put_labels``."""
        rows = writer.label_table(labels)
        with self._lock:
            return writer.put_labels(self._writable(), run_id, rows, replace=replace)

    def delete_label(self, run_id: str, round: int, pair_index: int, labeller: str) -> None:
        with self._lock:
            writer.delete_label(self._writable(), run_id, round, pair_index, labeller)

    def commit_batches(self, run_id: str, batches: Sequence[writer.PhaseBatch], **run_fields: Any) -> None:
        """Commit several prepared phases in one transaction (used by imports)."""
        with self._lock:
            writer.commit_batches(self._writable(), run_id, batches, **run_fields)

    def log_event(
        self,
        run_id: str,
        level: str,
        message: str,
        *,
        traceback: str | None = None,
        round: int | None = None,
        phase: str | None = None,
    ) -> None:
        """Append one event on its own, outside any phase commit (which never replaces it); ``round`` and
        ``phase`` say which phase it is about."""
        rows = writer.event_table([{"level": level, "message": message, "traceback": traceback}])
        with self._lock:
            writer.append_events(self._writable(), run_id, rows, round, phase)

    def append_metrics(self, run_id: str, round: int, phase: str, metrics: writer.Rows) -> None:
        """Add metrics to a committed phase (its checkpoint's cost, known after the commit); committing the phase
        again replaces them with its other rows."""
        rows = writer.build_batch(round, phase, metrics=metrics).tables["metrics"]
        with self._lock:
            writer.append_phase_rows(self._writable(), run_id, "metrics", rows, round, phase)

    def load_parquet(self, files: dict[str, Sequence[os.PathLike[str] | str]]) -> None:
        """Append Parquet files to tables (table -> files) in one transaction, by column name (a snapshot)."""
        with self._lock:
            writer.insert_parquet(self._writable(), {table: [str(f) for f in paths] for table, paths in files.items()})

    def discard_after(self, run_id: str, round: int, phase: str | None) -> None:
        """Delete everything committed after (round, phase), e.g. to line the store up with a resumed checkpoint."""
        with self._lock:
            writer.discard_after(self._writable(), run_id, round, phase)

    # -- named reads ----------------------------------------------------------------------------------------------

    def list_runs(self) -> pd.DataFrame:
        return queries.list_runs(self.cursor())

    def first_run_id(self) -> str | None:
        """The oldest run's id (a run directory's store holds one run); None when the store is empty."""
        return queries.first_run_id(self.cursor())

    def trained_run_ids(self) -> list[str]:
        """Ids of the runs that were trained here, not imported."""
        return queries.trained_run_ids(self.cursor())

    def run(self, run_id: str) -> dict[str, Any] | None:
        return queries.run_info(self.cursor(), run_id)

    def rounds(self, run_id: str) -> pd.DataFrame:
        return queries.rounds(self.cursor(), run_id)

    def committed_phases(self, run_id: str) -> list[tuple[int, str]]:
        return queries.committed_phases(self.cursor(), run_id)

    def rounds_without_pairs(self, run_id: str) -> pd.DataFrame:
        return queries.rounds_without_pairs(self.cursor(), run_id)

    def pairs_page(
        self,
        run_id: str,
        round: int | None = None,
        item: int | None = None,
        winner_side: str | None = None,
        min_gap: float | None = None,
        max_gap: float | None = None,
        text: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> pd.DataFrame:
        flt = queries.PairFilter(round, item, winner_side, min_gap, max_gap, text)
        return queries.pairs_page(self.cursor(), run_id, flt, limit=limit, offset=offset)

    def pairs_count(self, run_id: str, **filters: Any) -> int:
        return queries.pairs_count(self.cursor(), run_id, queries.pair_filter(**filters))

    def pair_position(self, run_id: str, pair: tuple[int, int], **filters: Any) -> int | None:
        """Where pair (round, pair index) sits, from 0, in ``pairs_page``'s order under ``filters``; None if absent."""
        return queries.pair_position(self.cursor(), run_id, queries.pair_filter(**filters), *pair)

    def pair_detail(self, run_id: str, round: int, pair_index: int) -> dict[str, Any] | None:
        return queries.pair_detail(self.cursor(), run_id, round, pair_index)

    def load_pairs(self, run_id: str, **filters: Any) -> list[PreferencePair]:
        return queries.load_pairs(self.cursor(), run_id, queries.pair_filter(**filters))

    def candidates_for_item(self, run_id: str, round: int, item: int) -> pd.DataFrame:
        return queries.candidates_for_item(self.cursor(), run_id, round, item)

    def metrics(self, run_id: str, names: list[str] | None = None) -> pd.DataFrame:
        return queries.metrics(self.cursor(), run_id, names)

    def labels(self, run_id: str, round: int | None = None) -> list[Label]:
        return queries.labels(self.cursor(), run_id, round)

    def replay(self, run_id: str) -> pd.DataFrame:
        return queries.replay(self.cursor(), run_id)

    def reward_distributions(self, run_id: str, round: int) -> pd.DataFrame:
        return queries.reward_distributions(self.cursor(), run_id, round)

    def binned_reward_distributions(self, run_id: str, round: int | None = None) -> pd.DataFrame:
        return queries.binned_reward_distributions(self.cursor(), run_id, round)

    def eval_curve(self, run_id: str) -> pd.DataFrame:
        return queries.eval_curve(self.cursor(), run_id)

    def events(self, run_id: str, *, level: str | None = None, limit: int = 500) -> pd.DataFrame:
        return queries.events(self.cursor(), run_id, level=level, limit=limit)

    def readonly_sql(self, query: str, limit: int = 1000, *, timeout_s: float | None = 30.0) -> pd.DataFrame:
        """Run one read-only query (``ReadOnlyQueryError`` if it could write); at most ``limit`` rows."""
        return sql_guard.run_readonly(self.cursor(), query, limit=limit, timeout_s=timeout_s)
