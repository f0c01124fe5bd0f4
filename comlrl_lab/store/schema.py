"""The store's DuckDB schema: table DDL, the record view, the schema version and its migrations.

This module owns every ``CREATE`` statement of the store and nothing else. It does not write data rows (that is
``writer``) and does not read them (``queries``). A file made by a newer comlrl-lab is refused rather than guessed at.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime, timezone

import duckdb

# Re-exported: the store names phases too. PHASES is a round of the reward function's runs, ALL_PHASES every phase
# name in round order (a labelled run's round), which the store checks and sorts by.
from comlrl_lab.names.phases import ALL_PHASES as ALL_PHASES
from comlrl_lab.names.phases import PHASES as PHASES

#: Bump when the DDL changes, and add a step to ``MIGRATIONS`` that brings version - 1 up to it.
SCHEMA_VERSION = 5


#: Tables whose rows belong to one committed (run, round, phase) and are replaced when it is committed again. Of
#: ``events`` only the rows the phase committed are (``logged`` false): the engine's log (a stop, a pause, a
#: failure) names the phase it is about but is never replaced.
PHASE_TABLES: tuple[str, ...] = ("candidates", "pairs", "replay", "metrics", "events", "reward_distributions")

# Small tables carry primary keys for upserts. The large ones (candidates, pairs, metrics) carry none: an ART index
# slows every bulk append and delete, while DuckDB's zone maps on (run_id, round), which rows arrive sorted by,
# already prune the page and detail queries to a few row groups.
TABLES: dict[str, str] = {
    "schema_version": """
        CREATE TABLE IF NOT EXISTS schema_version (
            version INTEGER NOT NULL,
            applied_at TIMESTAMP NOT NULL
        )""",
    "runs": """
        CREATE TABLE IF NOT EXISTS runs (
            run_id VARCHAR PRIMARY KEY,
            created_at TIMESTAMP NOT NULL,
            updated_at TIMESTAMP NOT NULL,
            trainer VARCHAR,
            status VARCHAR NOT NULL,
            source VARCHAR NOT NULL,
            num_agents INTEGER,
            config_json VARCHAR,
            -- true while the run's pairs sit in the file in (round, pair_index) order, so exports need no sort
            pairs_in_order BOOLEAN NOT NULL DEFAULT true
        )""",
    "rounds": """
        CREATE TABLE IF NOT EXISTS rounds (
            run_id VARCHAR NOT NULL,
            round INTEGER NOT NULL,
            status VARCHAR NOT NULL,
            collect_at TIMESTAMP,
            select_at TIMESTAMP,
            train_at TIMESTAMP,
            evaluate_at TIMESTAMP,
            num_candidates INTEGER NOT NULL DEFAULT 0,
            num_pairs INTEGER NOT NULL DEFAULT 0,
            num_drawn INTEGER NOT NULL DEFAULT 0,
            label_at TIMESTAMP,  -- version 4: the label phase of a run labelled by people or a judge
            PRIMARY KEY (run_id, round)
        )""",
    "phases": """
        CREATE TABLE IF NOT EXISTS phases (
            run_id VARCHAR NOT NULL,
            round INTEGER NOT NULL,
            phase VARCHAR NOT NULL,
            committed_at TIMESTAMP NOT NULL,
            PRIMARY KEY (run_id, round, phase)
        )""",
    "candidates": """
        CREATE TABLE IF NOT EXISTS candidates (
            run_id VARCHAR NOT NULL,
            round INTEGER NOT NULL,
            phase VARCHAR NOT NULL,
            item_index INTEGER NOT NULL,
            side VARCHAR NOT NULL,
            candidate_index INTEGER NOT NULL,
            prompts VARCHAR[] NOT NULL,
            completions VARCHAR[] NOT NULL,
            prompt_token_counts INTEGER[],
            token_counts INTEGER[],
            raw_reward DOUBLE,
            reward DOUBLE,
            parse_status VARCHAR NOT NULL,
            -- version 5: the task reward's breakdown of the candidate as JSON (a code task's levels and program)
            details_json VARCHAR
        )""",
    "pairs": """
        CREATE TABLE IF NOT EXISTS pairs (
            run_id VARCHAR NOT NULL,
            round INTEGER NOT NULL,
            phase VARCHAR NOT NULL,
            pair_index INTEGER NOT NULL,
            item_index INTEGER,
            winner_candidate_index INTEGER,
            loser_candidate_index INTEGER,
            winner_side VARCHAR,
            prompts VARCHAR[] NOT NULL,
            winner_completions VARCHAR[] NOT NULL,
            loser_completions VARCHAR[] NOT NULL,
            winner_reward DOUBLE NOT NULL,
            loser_reward DOUBLE NOT NULL,
            candidate_reward_mean DOUBLE NOT NULL,
            raw_rewards DOUBLE[],
            target_raw_reward DOUBLE,
            comparator_raw_reward DOUBLE,
            reward_gap DOUBLE NOT NULL,
            winner_token_counts INTEGER[],
            loser_token_counts INTEGER[],
            extra_json VARCHAR
        )""",
    "replay": """
        CREATE TABLE IF NOT EXISTS replay (
            run_id VARCHAR NOT NULL,
            round INTEGER NOT NULL,
            phase VARCHAR NOT NULL,
            source_round INTEGER NOT NULL,
            mode VARCHAR NOT NULL,
            weight DOUBLE NOT NULL,
            drawn_count INTEGER NOT NULL,
            num_pairs INTEGER
        )""",
    "metrics": """
        CREATE TABLE IF NOT EXISTS metrics (
            run_id VARCHAR NOT NULL,
            round INTEGER,
            phase VARCHAR,
            step INTEGER NOT NULL,
            name VARCHAR NOT NULL,
            value DOUBLE
        )""",
    "events": """
        CREATE TABLE IF NOT EXISTS events (
            run_id VARCHAR NOT NULL,
            ts TIMESTAMP NOT NULL,
            round INTEGER,
            phase VARCHAR,
            level VARCHAR NOT NULL,
            message VARCHAR NOT NULL,
            traceback VARCHAR,
            logged BOOLEAN NOT NULL DEFAULT false
        )""",
    # One row per (round, series, side) of a run with log_reward_distribution: CoMLRL's reward_distributions file.
    "reward_distributions": """
        CREATE TABLE IF NOT EXISTS reward_distributions (
            run_id VARCHAR NOT NULL,
            round INTEGER NOT NULL,
            phase VARCHAR NOT NULL,
            series VARCHAR NOT NULL,
            side VARCHAR NOT NULL,
            reward_min DOUBLE NOT NULL,
            reward_max DOUBLE NOT NULL,
            bin_edges DOUBLE[] NOT NULL,
            counts INTEGER[] NOT NULL,
            sample_count INTEGER NOT NULL,
            mean DOUBLE,
            raw_rewards DOUBLE[]
        )""",
    # One verdict per (comparison, labeller): people's from the Pairs page or an import, a judge's from its label
    # phase. A comparison is a pair of the collect phase (round, pair_index). Rows are written as they are given,
    # outside any phase commit, so no phase commit or roll-back removes them; a_side records which stored side
    # (winner or loser, in the reward function's order) was shown as A.
    "labels": """
        CREATE TABLE IF NOT EXISTS labels (
            run_id VARCHAR NOT NULL,
            round INTEGER NOT NULL,
            pair_index INTEGER NOT NULL,
            labeller VARCHAR NOT NULL,
            verdict VARCHAR NOT NULL,
            a_side VARCHAR NOT NULL,
            labelled_at TIMESTAMP NOT NULL,
            PRIMARY KEY (run_id, round, pair_index, labeller)
        )""",
}

#: The seed's JSON record as a view of ``pairs``: the nine fields in the seed page's order, ``raw_rewards`` [] when
#: absent, as ``PreferencePair.to_record()`` writes it. Exports select from here.
VIEWS: dict[str, str] = {
    "pair_records": """
        CREATE OR REPLACE VIEW pair_records AS
        SELECT run_id, round, pair_index, item_index, winner_candidate_index, loser_candidate_index, winner_side,
               reward_gap,
               prompts, winner_completions, loser_completions,
               winner_reward, loser_reward, candidate_reward_mean,
               coalesce(raw_rewards, []::DOUBLE[]) AS raw_rewards,
               target_raw_reward, comparator_raw_reward
        FROM pairs""",
}

#: Every relation a read-only query may name.
READABLE_RELATIONS: frozenset[str] = frozenset(TABLES) | frozenset(VIEWS)


def _add_reward_distributions(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(TABLES["reward_distributions"])


def _add_event_origin(con: duckdb.DuckDBPyConnection) -> None:
    # Before version 3 no trainer committed events with a phase; every stored event came from the log.
    con.execute("ALTER TABLE events ADD COLUMN logged BOOLEAN NOT NULL DEFAULT true")
    con.execute("ALTER TABLE events ALTER COLUMN logged SET DEFAULT false")


def _add_labels(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(TABLES["labels"])
    con.execute("ALTER TABLE rounds ADD COLUMN label_at TIMESTAMP")


def _add_candidate_details(con: duckdb.DuckDBPyConnection) -> None:
    # Candidates stored before version 5 were scored without a breakdown: NULL.
    con.execute("ALTER TABLE candidates ADD COLUMN details_json VARCHAR")


#: version -> step that upgrades a store from ``version - 1`` to ``version``.
MIGRATIONS: dict[int, Callable[[duckdb.DuckDBPyConnection], None]] = {
    2: _add_reward_distributions,  # 1 -> 2: the reward_distributions table (log_reward_distribution)
    3: _add_event_origin,  # 2 -> 3: events.logged, so a phase committed again keeps the log about it
    4: _add_labels,  # 3 -> 4: the labels table and rounds.label_at (preference_source human or judge)
    5: _add_candidate_details,  # 4 -> 5: candidates.details_json (the reward's breakdown, reward_details)
}


def utcnow() -> datetime:
    """The store's clock: naive UTC, which is how every TIMESTAMP column is read back."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


class SchemaVersionError(RuntimeError):
    """The file's schema cannot be used by this version of comlrl-lab."""


def stored_version(con: duckdb.DuckDBPyConnection) -> int | None:
    """The schema version recorded in the file, or None for a file without the store's tables."""
    exists = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'main' AND table_name = 'schema_version'"
    ).fetchone()[0]
    if not exists:
        return None
    return con.execute("SELECT max(version) FROM schema_version").fetchone()[0]


@functools.cache
def expected_columns() -> dict[str, list[str]]:
    """Each table's columns as the DDL above declares them (built once in an in-memory database)."""
    mem = duckdb.connect()
    try:
        for ddl in TABLES.values():
            mem.execute(ddl)
        return _live_columns(mem)
    finally:
        mem.close()


def _live_columns(con: duckdb.DuckDBPyConnection) -> dict[str, list[str]]:
    rows = con.execute(
        "SELECT table_name, column_name FROM duckdb_columns() WHERE schema_name = 'main' AND NOT internal "
        "ORDER BY table_name, column_index"
    ).fetchall()
    out: dict[str, list[str]] = {}
    for table, column in rows:
        out.setdefault(table, []).append(column)
    return out


def check_columns(con: duckdb.DuckDBPyConnection) -> None:
    """Refuse a file whose tables differ from what its schema version promises (a hand-edited or foreign file)."""
    live = _live_columns(con)
    for table, columns in expected_columns().items():
        if live.get(table) != columns:
            raise SchemaVersionError(
                f"table {table!r} has columns {live.get(table)} but schema version {SCHEMA_VERSION} expects {columns}"
            )


def ensure_schema(con: duckdb.DuckDBPyConnection, *, read_only: bool = False) -> int:
    """Create the schema in a new file, migrate an older one, and return the version now in use."""
    version = stored_version(con)
    if version is not None and version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"store schema version {version} is newer than this comlrl-lab supports ({SCHEMA_VERSION}); upgrade comlrl-lab"
        )
    if read_only:
        if version is None:
            raise SchemaVersionError("not a comlrl-lab store: the file has no schema_version table")
        if version < SCHEMA_VERSION:
            raise SchemaVersionError(
                f"store schema version {version} is older than {SCHEMA_VERSION}; open it read-write once to migrate it"
            )
        check_columns(con)
        return version
    if version is None:
        # Another tool's database: adding our tables to it would change a file we do not own.
        foreign = [row[0] for row in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()]
        if foreign:
            raise SchemaVersionError(
                f"not a comlrl-lab store: the file holds other tables ({', '.join(foreign[:5])}"
                f"{', ...' if len(foreign) > 5 else ''}) and no schema_version; comlrl-lab leaves it unchanged"
            )
    missing = [v for v in range((version or SCHEMA_VERSION) + 1, SCHEMA_VERSION + 1) if v not in MIGRATIONS]
    if version is not None and missing:
        raise SchemaVersionError(f"no migration to schema version(s) {missing} from {version}")
    con.execute("BEGIN TRANSACTION")
    try:
        if version is None:
            for ddl in TABLES.values():
                con.execute(ddl)
            con.execute("INSERT INTO schema_version VALUES (?, ?)", [SCHEMA_VERSION, utcnow()])
        else:
            for target in range(version + 1, SCHEMA_VERSION + 1):
                MIGRATIONS[target](con)
                con.execute("INSERT INTO schema_version VALUES (?, ?)", [target, utcnow()])
        check_columns(con)
        for ddl in VIEWS.values():
            con.execute(ddl)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return SCHEMA_VERSION
