"""Store: schema and versions, one transaction per phase, idempotent re-commits, kill -9 and resume, named queries,
threads, and the read-only SQL entry point."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from store_fixtures import expected_counts, make_candidates, make_pairs, phase_payload

from comlrl_lab.data.labels import Label
from comlrl_lab.store import (
    PHASES,
    SCHEMA_VERSION,
    QueryExecutionError,
    ReadOnlyQueryError,
    RunStore,
    SchemaVersionError,
    schema,
)
from comlrl_lab.store import writer as store_writer

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def table_count(store: RunStore, table: str, run_id: str = "r") -> int:
    return store.readonly_sql(f"SELECT count(*) AS n FROM {table} WHERE run_id = '{run_id}'")["n"][0]


# -- schema ------------------------------------------------------------------------------------------------------


def test_new_file_gets_schema_and_version_and_reopens(tmp_path):
    path = tmp_path / "run.duckdb"
    with RunStore(path) as s:
        tables = set(s.readonly_sql("SHOW TABLES")["name"])
    assert {"runs", "rounds", "phases", "candidates", "pairs", "replay", "metrics", "events"} <= tables
    with RunStore(path) as s:
        versions = s.readonly_sql("SELECT version FROM schema_version")["version"].tolist()
    assert versions == [SCHEMA_VERSION]  # reopening does not re-create or re-stamp
    with RunStore(path, read_only=True) as s:
        assert s.list_runs().empty


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "run.duckdb"
    RunStore(path).close()
    con = duckdb.connect(str(path))
    con.execute("INSERT INTO schema_version VALUES (?, now()::TIMESTAMP)", [SCHEMA_VERSION + 1])
    con.close()
    with pytest.raises(SchemaVersionError, match="newer"):
        RunStore(path)


def test_a_file_that_differs_from_its_schema_version_is_refused(tmp_path):
    path = tmp_path / "run.duckdb"
    RunStore(path).close()
    con = duckdb.connect(str(path))
    con.execute("ALTER TABLE pairs DROP COLUMN reward_gap")
    con.close()
    with pytest.raises(SchemaVersionError, match="'pairs' has columns"):
        RunStore(path)
    with pytest.raises(SchemaVersionError, match="'pairs' has columns"):
        RunStore(path, read_only=True)


def test_read_only_needs_a_store_and_refuses_writes(tmp_path):
    with pytest.raises(FileNotFoundError):
        RunStore(tmp_path / "missing.duckdb", read_only=True)
    plain = tmp_path / "plain.duckdb"
    duckdb.connect(str(plain)).close()
    with pytest.raises(SchemaVersionError, match="not a comlrl-lab store"):
        RunStore(plain, read_only=True)
    path = tmp_path / "run.duckdb"
    RunStore(path).close()
    with RunStore(path, read_only=True) as s, pytest.raises(PermissionError, match="read-only"):
        s.commit_phase("r", 1, "collect", pairs=make_pairs(1, 1))


def test_closed_store_says_so(tmp_path):
    s = RunStore(tmp_path / "run.duckdb")
    s.close()
    with pytest.raises(RuntimeError, match="closed"):
        s.list_runs()


# -- commits ------------------------------------------------------------------------------------------------------


def test_commit_phase_stores_every_field(store):
    pairs = make_pairs(1, 6)
    store.create_run("r", trainer="MADPOIterTrainer", config={"num_iterations": 3, "dpo_beta": 0.1})
    store.commit_phase("r", 1, "collect", candidates=make_candidates(3), pairs=pairs)
    detail = store.pair_detail("r", 1, 3)
    assert detail["record"] == pairs[3].to_record()
    assert list(detail["record"]) == list(pairs[3].to_record())  # key order of the seed record
    assert detail["winner_side"] == "comparator" and detail["item_index"] == 3
    assert detail["winner_token_counts"] == [4, 4] and detail["loser_token_counts"] == [2, 2]
    assert detail["reward_gap"] == pytest.approx(pairs[3].reward_gap)
    cands = store.candidates_for_item("r", 1, 2)
    assert len(cands) == 4 and list(cands["side"]) == ["current", "current", "comparator", "comparator"]
    assert list(cands.iloc[1]["token_counts"]) == [2, 3]
    assert set(cands["parse_status"]) == {"ok", "unparsed"}
    run = store.run("r")
    assert run["trainer"] == "MADPOIterTrainer" and run["num_agents"] == 2 and '"dpo_beta": 0.1' in run["config_json"]
    assert store.load_pairs("r") == [
        p.__class__(**{**p.__dict__, "prompt_ids": None, "winner_ids": None, "loser_ids": None}) for p in pairs
    ]


def test_recommit_replaces_rows_and_never_duplicates(store):
    store.commit_phase("r", 1, "collect", pairs=make_pairs(1, 10), metrics=[("turn_1/reward_mean", 1.0)])
    store.commit_phase("r", 1, "collect", pairs=make_pairs(1, 10), metrics=[("turn_1/reward_mean", 1.0)])
    assert store.pairs_count("r") == 10 and table_count(store, "metrics") == 1
    store.commit_phase("r", 1, "collect", pairs=make_pairs(1, 4))
    assert store.pairs_count("r") == 4 and table_count(store, "metrics") == 0
    assert store.committed_phases("r") == [(1, "collect")]
    assert store.rounds("r")["num_pairs"].tolist() == [4]


def test_a_failed_commit_leaves_the_previous_one_whole(store, monkeypatch):
    store.commit_phase("r", 1, "collect", pairs=make_pairs(1, 5), metrics=[("a", 1.0)])
    real_append = store_writer._append

    def failing_append(con, table, rows, key):
        if table == "metrics":
            raise RuntimeError("disk full")
        real_append(con, table, rows, key)

    monkeypatch.setattr(store_writer, "_append", failing_append)
    with pytest.raises(RuntimeError, match="disk full"):
        store.commit_phase("r", 1, "collect", pairs=make_pairs(1, 9), metrics=[("a", 2.0)])
    monkeypatch.undo()
    assert store.pairs_count("r") == 5
    assert store.metrics("r")["value"].tolist() == [1.0]


def test_commit_validates_its_input(store):
    with pytest.raises(ValueError, match="phase must be one of"):
        store.commit_phase("r", 1, "eval", metrics=[("a", 1.0)])
    with pytest.raises(ValueError, match="round_index 2 but is committed to round 1"):
        store.commit_phase("r", 1, "collect", pairs=make_pairs(2, 1))
    with pytest.raises(ValueError, match="replay row 0 lacks"):
        store.commit_phase("r", 1, "select", replay_rows=[{"source_round": 1, "mode": "current"}])
    with pytest.raises(ValueError, match="run_id"):
        store.commit_phase("", 1, "train", metrics=[("a", 1.0)])
    assert store.list_runs().empty


def test_pairs_may_come_as_an_arrow_table(store):
    table = pa.table(
        {
            "prompts": [["a", "b"]] * 3,
            "winner_completions": [["w", "w"]] * 3,
            "loser_completions": [["l", "l"]] * 3,
            "winner_reward": [1.0, 2.0, 3.0],
            "loser_reward": [0.0, 0.0, 0.0],
            "candidate_reward_mean": [0.5, 1.0, 1.5],
            "winner_side": ["current", "comparator", "current"],
        }
    )
    store.commit_phase("r", 1, "collect", pairs=table)
    page = store.pairs_page("r", winner_side="current")
    assert page["pair_index"].tolist() == [0, 2] and page["reward_gap"].tolist() == [1.0, 3.0]


def test_rounds_phases_and_discard_after(store):
    for r in (1, 2):
        for phase in PHASES:
            store.commit_phase("r", r, phase, **phase_payload(r, phase, pairs_per_round=5))
    rounds = store.rounds("r")
    assert rounds["status"].tolist() == ["evaluate", "evaluate"]
    assert rounds["num_pairs"].tolist() == [5, 5] and rounds["num_drawn"].tolist() == [10, 20]
    assert rounds["evaluate_at"].notna().all()
    store.discard_after("r", 2, "collect")
    assert store.committed_phases("r") == [*((1, p) for p in PHASES), (2, "collect")]
    rounds = store.rounds("r")
    assert rounds["status"].tolist() == ["evaluate", "collect"]
    assert rounds["select_at"].isna().tolist() == [False, True]
    assert store.replay("r")["round"].unique().tolist() == [1]
    store.discard_after("r", 1, None)
    assert store.rounds("r")["round"].tolist() == [1] and store.pairs_count("r") == 5


def test_metrics_added_after_a_commit_join_the_phase_and_a_recommit_replaces_them(store):
    store.commit_phase("r", 1, "collect", metrics=[(3, "time/collect_seconds", 1.5)])
    store.append_metrics("r", 1, "collect", [{"step": 3, "name": "checkpoint/collect_bytes", "value": 2048.0}])
    got = store.metrics("r", names=["checkpoint/collect_bytes", "time/"])
    assert got[["round", "phase", "step", "name", "value"]].values.tolist() == [
        [1, "collect", 3, "checkpoint/collect_bytes", 2048.0],
        [1, "collect", 3, "time/collect_seconds", 1.5],
    ]
    store.commit_phase("r", 1, "collect", metrics=[(3, "time/collect_seconds", 1.25)])
    assert store.metrics("r")["name"].tolist() == ["time/collect_seconds"]
    with pytest.raises(ValueError, match="phase must be one of"):
        store.append_metrics("r", 1, "sleep", [("checkpoint/collect_bytes", 1.0)])


def test_log_event_survives_phase_commits(store):
    store.commit_phase("r", 1, "collect", events=[{"level": "info", "message": "in phase"}])
    store.log_event("r", "error", "boom", traceback="Traceback ...", round=1)
    # The log names the phase it is about (a stop during collect); committing that phase later must keep it.
    store.log_event("r", "info", "collect of round 1 cancelled", round=1, phase="collect")
    store.commit_phase("r", 1, "collect", events=[{"level": "info", "message": "in phase again"}])
    events = store.events("r")
    assert sorted(events["message"]) == ["boom", "collect of round 1 cancelled", "in phase again"]
    assert store.events("r", level="error")["traceback"].tolist() == ["Traceback ..."]
    store.discard_after("r", 0, None)  # a resume before round 1: the phase's rows go, the log stays
    assert sorted(store.events("r")["message"]) == ["boom", "collect of round 1 cancelled"]


def test_a_phase_commit_sets_the_runs_status_in_the_same_transaction(store):
    store.create_run("r", trainer="MADPOIter")
    store.commit_phase("r", 1, "collect", pairs=make_pairs(1, 2), status="running")
    assert store.run("r")["status"] == "running"
    store.commit_phase("r", 1, "evaluate", status="finished")
    assert store.run("r")["status"] == "finished"
    store.commit_phase("r", 1, "evaluate")  # no status given: the run keeps its own
    assert store.run("r")["status"] == "finished"


#: What version 5 added to the candidates' DDL.
VERSION_5_DETAILS = schema.TABLES["candidates"][
    schema.TABLES["candidates"].index(",\n            -- version 5") : schema.TABLES["candidates"].index("\n        )")
]


def test_a_version_2_store_is_migrated_and_keeps_its_events_as_the_log(tmp_path):
    path = tmp_path / "old.duckdb"
    with duckdb.connect(str(path)) as con:
        for name, ddl in schema.TABLES.items():
            if name != "labels":  # version 4's
                con.execute(
                    ddl.replace(",\n            logged BOOLEAN NOT NULL DEFAULT false", "")
                    .replace(
                        "            label_at TIMESTAMP,  -- version 4: the label phase of a run labelled by people or a judge\n",
                        "",
                    )
                    .replace(VERSION_5_DETAILS, "")
                )
        con.execute("INSERT INTO schema_version VALUES (2, now())")
        con.execute("INSERT INTO events VALUES ('r', now(), 1, 'collect', 'error', 'boom', NULL)")
    with RunStore(path) as s:
        s.commit_phase("r", 1, "collect", pairs=make_pairs(1, 1))
        assert s.events("r")["message"].tolist() == ["boom"]


# -- named queries -----------------------------------------------------------------------------------------------


def test_pairs_page_filters_count_and_order(store):
    for r in (1, 2, 3):
        store.commit_phase("r", r, "collect", pairs=make_pairs(r, 40))
    everything = [p for r in (1, 2, 3) for p in make_pairs(r, 40)]
    cases = [
        {},
        {"round": 2},
        {"round": 2, "winner_side": "comparator"},
        {"min_gap": 5.0},
        {"max_gap": 2.0, "winner_side": "current"},
        {"item": 7},
        {"text": "勝ち R3 #1"},
        {"round": 1, "text": "LOSER r1 #3 A1"},
    ]
    for flt in cases:
        expected = [
            (p.round_index, p.item_index)
            for p in everything
            if flt.get("round") in (None, p.round_index)
            and flt.get("item") in (None, p.item_index)
            and flt.get("winner_side") in (None, p.winner_side)
            and p.reward_gap >= flt.get("min_gap", -1e9)
            and p.reward_gap <= flt.get("max_gap", 1e9)
            and (
                "text" not in flt
                or any(flt["text"].lower() in t.lower() for t in p.prompts + p.winner_completions + p.loser_completions)
            )
        ]
        assert store.pairs_count("r", **flt) == len(expected), flt
        page = store.pairs_page("r", **flt, limit=7, offset=2)
        assert list(zip(page["round"], page["item_index"])) == expected[2:9], flt
    with pytest.raises(ValueError, match="unknown pair filter"):
        store.pairs_count("r", side="current")


def test_ui_queries(store):
    store.create_run("r", trainer="MARLHFIterTrainer")
    for r in (1, 2):
        for phase in PHASES:
            store.commit_phase("r", r, phase, **phase_payload(r, phase, pairs_per_round=6))
    store.commit_phase("r", 2, "collect", **phase_payload(2, "collect", pairs_per_round=6))
    runs = store.list_runs()
    assert runs[["run_id", "num_rounds", "num_pairs"]].values.tolist() == [["r", 2, 12]]
    assert set(store.metrics("r", names=["train/"])["name"]) == {"train/loss"}
    assert len(store.metrics("r", names=["train/loss", "eval/turn_1/reward_mean"])) == 2 * 25 + 2
    curve = store.eval_curve("r")
    assert curve["value"].tolist() == pytest.approx([0.1, 0.2])
    replay = store.replay("r")
    assert replay[replay["round"] == 2]["source_round"].tolist() == [1, 2]
    dist = store.reward_distributions("r", 1)
    assert set(dist["series"]) == {"candidate", "selected"}
    assert (dist["series"] == "selected").sum() == 12  # current and comparator raw reward of each of 6 pairs
    assert store.committed_phases("r")[-1] == (2, "evaluate")


def test_reads_from_threads_while_the_engine_writes(tmp_path):
    s = RunStore(tmp_path / "run.duckdb")
    errors: list[BaseException] = []
    seen: set[int] = set()
    done = threading.Event()

    def engine():
        try:
            for r in range(1, 13):
                s.commit_phase("r", r, "collect", pairs=make_pairs(r, 200), candidates=make_candidates(10))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            done.set()

    def reader():
        try:
            while not done.is_set():
                n = s.pairs_count("r")
                assert n % 200 == 0, n  # a phase is seen whole or not at all
                seen.add(n)
                s.pairs_page("r", winner_side="current", min_gap=1.0, offset=10)
                s.rounds("r")
                s.readonly_sql("SELECT round, count(*) FROM pairs GROUP BY round")
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=engine)] + [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert s.pairs_count("r") == 12 * 200
    s.close()


def test_cursors_of_finished_threads_are_closed(store):
    store.commit_phase("r", 1, "collect", pairs=make_pairs(1, 3))
    for _ in range(20):  # Streamlit runs every rerun in a fresh thread
        t = threading.Thread(target=lambda: store.pairs_page("r"))
        t.start()
        t.join()
    store.list_runs()
    assert len(store._cursors) <= 2


# -- kill -9 in the middle of training, then resume ----------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    from store_fixtures import phase_payload
    from comlrl_lab.store import PHASES, RunStore

    path, start_round, start_phase, last_round, discard = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), sys.argv[6]
    store = RunStore(path)
    if discard != "-":
        r, p = discard.split(":")
        store.discard_after("r", int(r), p)
    order = [(r, p) for r in range(1, last_round + 1) for p in PHASES]
    for r, phase in order[order.index((start_round, start_phase)):]:
        store.commit_phase("r", r, phase, **phase_payload(r, phase))
        print(r, phase, flush=True)
    store.close()
    print("done", flush=True)
    """
)

ORDER = [(r, p) for r in range(1, 7) for p in PHASES]


def run_child(script: Path, db: Path, start: tuple[int, str], discard: str, kill_after: int | None) -> list[tuple]:
    """Run the committing child; SIGKILL it (by PID) a random moment after ``kill_after`` reported commits."""
    proc = subprocess.Popen(
        [sys.executable, str(script), str(TESTS), str(db), str(start[0]), start[1], str(ORDER[-1][0]), discard],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    reported = []
    try:
        for line in proc.stdout:
            if line.strip() == "done":
                break
            r, phase = line.split()
            reported.append((int(r), phase))
            if kill_after is not None and len(reported) >= kill_after:
                time.sleep(random.Random(len(reported)).uniform(0.0, 0.05))  # land inside the next commit, or near it
                os.kill(proc.pid, signal.SIGKILL)
                break
    finally:
        proc.wait(timeout=120)
        # Lines still in the pipe were printed after their commit, so those phases are committed too.
        reported += [
            (int(r), p) for r, p in (line.split() for line in proc.stdout.read().splitlines() if line != "done")
        ]
        proc.stdout.close()
    if kill_after is not None:
        assert proc.returncode == -signal.SIGKILL
    return reported


def check_store(db: Path, reported: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Every reported phase is present exactly once, at most the one in flight besides, and nothing else."""
    with RunStore(db) as s:
        committed = s.committed_phases("r")
        assert set(reported) <= set(committed)
        extra = set(committed) - set(reported)
        nxt = ORDER[ORDER.index(reported[-1]) + 1] if reported and reported[-1] != ORDER[-1] else None
        assert extra <= {nxt}, (extra, nxt)
        counts = s.readonly_sql(
            """
            SELECT t, round, phase, count(*) AS n FROM (
                SELECT 'pairs' AS t, round, phase FROM pairs UNION ALL
                SELECT 'candidates', round, phase FROM candidates UNION ALL
                SELECT 'replay', round, phase FROM replay UNION ALL
                SELECT 'metrics', round, phase FROM metrics UNION ALL
                SELECT 'events', round, phase FROM events)
            GROUP BY ALL
            """,
            limit=10_000,
        )
        got = {(t, int(r), p): int(n) for t, r, p, n in counts.itertuples(index=False)}
        want = {(t, r, p): n for r, p in committed for t, n in expected_counts(r, p).items() if n}
        assert got == want  # every committed phase whole and once; nothing from uncommitted phases
        for table, key in (
            ("pairs", "round, pair_index"),
            ("candidates", "round, item_index, side, candidate_index"),
            ("metrics", "round, phase, step, name"),
            ("replay", "round, source_round"),
        ):
            dups = s.readonly_sql(f"SELECT {key}, count(*) AS n FROM {table} GROUP BY ALL HAVING n > 1")
            assert dups.empty, (table, dups)
        assert s.rounds("r")["round"].tolist() == sorted({r for r, _ in committed})
    with RunStore(db, read_only=True) as s:  # the file opens cleanly after the crash, read-only too
        assert s.pairs_count("r") == sum(expected_counts(r, p)["pairs"] for r, p in committed)
    return committed


@pytest.mark.timeout(600)
def test_kill_9_mid_training_then_resume(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    db = tmp_path / "run.duckdb"
    # 1st life: killed after a few commits.
    reported = run_child(script, db, ORDER[0], "-", kill_after=5)
    committed = check_store(db, reported)
    # 2nd life: the checkpoint lags one phase behind the store; it discards what is newer, then goes on.
    checkpoint = reported[-2]
    reported = reported[:-1] + run_child(
        script, db, ORDER[ORDER.index(checkpoint) + 1], f"{checkpoint[0]}:{checkpoint[1]}", kill_after=6
    )
    committed = check_store(db, reported)
    # 3rd life: no discard; phases already in the store are committed again and must replace, not duplicate.
    restart = ORDER[max(0, ORDER.index(committed[-1]) - 2)]
    reported = sorted(set(reported + run_child(script, db, restart, "-", kill_after=None)), key=ORDER.index)
    assert reported == ORDER
    committed = check_store(db, reported)
    assert committed == ORDER
    with RunStore(db) as s:
        assert s.load_pairs("r", round=3)[17].to_record() == make_pairs(3, 1500)[17].to_record()


# -- read-only SQL ------------------------------------------------------------------------------------------------

ACCEPTED = [
    "SELECT * FROM pairs",
    "select round, count(*) from pairs group by round",
    "WITH c AS (SELECT round FROM pairs) SELECT * FROM c",
    "FROM pair_records LIMIT 2",
    "SHOW TABLES",
    "DESCRIBE pairs",
    "SUMMARIZE metrics",
    "EXPLAIN SELECT * FROM pairs",
    "SELECT 'drop table pairs; delete from runs' AS harmless_text",
    'SELECT 1 AS "update"',
    "-- a comment\nSELECT * FROM runs;",
    "SELECT * FROM information_schema.columns",
    "SELECT * FROM duckdb_views() WHERE view_name = 'pairs'",  # in the SQL box the store's relations are views
    "SELECT unnest(prompts) FROM pairs",
    "SELECT * FROM range(3)",
]

REFUSED = [
    ("INSERT INTO runs SELECT * FROM runs", "INSERT"),
    ("UPDATE pairs SET round = 2", "UPDATE"),
    ("DELETE FROM pairs", "DELETE"),
    ("DROP TABLE pairs", "DROP"),
    ("CREATE TABLE x (a INT)", "CREATE"),
    ("CREATE OR REPLACE VIEW pairs2 AS SELECT 1", "CREATE"),
    ("ALTER TABLE pairs ADD COLUMN q INT", "ALTER"),
    ("ATTACH 'other.duckdb' AS other", "ATTACH"),
    ("DETACH other", "DETACH"),
    ("COPY pairs TO 'out.csv'", "COPY"),
    ("COPY (SELECT 1) TO 'out.parquet' (FORMAT parquet)", "COPY"),
    ("EXPORT DATABASE 'dump'", "EXPORT"),
    ("IMPORT DATABASE 'dump'", "IMPORT"),
    ("INSTALL httpfs", "INSTALL"),
    ("LOAD httpfs", "LOAD"),
    ("SET threads = 1", "SET"),
    ("RESET threads", "RESET"),
    ("PRAGMA version", "PRAGMA"),
    ("CALL pragma_version()", "CALL"),
    ("CHECKPOINT", "CHECKPOINT"),
    ("VACUUM", "VACUUM"),
    ("TRUNCATE pairs", "TRUNCATE"),
    ("USE memory", "USE"),
    ("BEGIN TRANSACTION", "BEGIN"),
    ("SELECT 1; DROP TABLE pairs", "one statement"),
    ("SELECT 1 /* ; */ ; DELETE FROM pairs", "one statement"),
    ("SELECT 1 -- harmless\n; DELETE FROM pairs", "one statement"),
    ("WITH gone AS (DELETE FROM pairs RETURNING *) SELECT * FROM gone", "DELETE"),
    ("WITH x AS (SELECT 1) INSERT INTO runs SELECT * FROM runs", "INSERT"),
    ("SELECT * FROM read_csv('/etc/hosts')", "read_csv"),
    ("SELECT * FROM '/etc/hosts'", "not a table of this store"),
    ("SELECT * FROM read_text('/etc/hosts')", "read_text"),
    ("SELECT * FROM glob('*')", "glob"),
    ("SELECT nextval('seq')", "nextval"),
    ("SELECT * FROM query('SELECT 1')", "query"),
    ("SELECT * FROM no_such_table", "not a table of this store"),
    ("", "empty"),
    ("SELEC * FROM pairs", "could not be parsed"),
]


@pytest.mark.parametrize("query", ACCEPTED)
def test_readonly_sql_accepts_reads(store, query):
    store.commit_phase("r", 1, "collect", pairs=make_pairs(1, 3))
    df = store.readonly_sql(query, limit=50)
    assert len(df) >= 1


@pytest.mark.parametrize(("query", "reason"), REFUSED)
def test_readonly_sql_refuses_everything_else(store, query, reason):
    store.commit_phase("r", 1, "collect", pairs=make_pairs(1, 3))
    with pytest.raises(ReadOnlyQueryError, match=reason):
        store.readonly_sql(query)
    assert store.pairs_count("r") == 3
    assert set(store.readonly_sql("SHOW TABLES")["name"]) >= {"pairs", "runs"}
    assert not (Path.cwd() / "out.csv").exists()


def test_readonly_sql_is_a_value_error_with_limits_and_timeouts(store):
    store.commit_phase("r", 1, "collect", pairs=make_pairs(1, 30))
    assert issubclass(ReadOnlyQueryError, ValueError)
    df = store.readonly_sql("SELECT * FROM pairs", limit=10)
    assert len(df) == 10 and df.attrs["truncated"] is True
    assert store.readonly_sql("SELECT count(*) FROM pairs").attrs["truncated"] is False
    with pytest.raises(QueryExecutionError, match="no_such_column"):
        store.readonly_sql("SELECT no_such_column FROM pairs")
    with pytest.raises(QueryExecutionError, match="longer than"):
        store.readonly_sql("SELECT sum(hash(range)) FROM range(100000000000)", timeout_s=0.3)
    assert store.pairs_count("r") == 30  # the cursor and the store are still usable


# -- labels (schema version 4) -------------------------------------------------------------------------------------


def _label(pair_index: int, verdict: str, who: str = "ann", round_: int = 1) -> Label:
    return Label(round=round_, pair_index=pair_index, labeller=who, verdict=verdict, a_side="winner")


def test_labels_are_written_at_once_replaced_by_their_labeller_kept_by_an_import_and_undone(store):
    store.commit_phase("r", 1, "collect", pairs=make_pairs(1, 3))
    assert store.put_labels("r", [_label(0, "A")]) == 1
    assert store.put_labels("r", [_label(0, "B"), _label(1, "tie", "bob")]) == 2  # ann changes her mind
    assert [(x.pair_index, x.labeller, x.verdict) for x in store.labels("r")] == [(0, "ann", "B"), (1, "bob", "tie")]
    # An import never overwrites: ann's verdict on 0 stays B, the new row is written.
    assert store.put_labels("r", [_label(0, "A"), _label(2, "both_bad")], replace=False) == 1
    assert [(x.pair_index, x.verdict) for x in store.labels("r") if x.labeller == "ann"] == [(0, "B"), (2, "both_bad")]
    store.delete_label("r", 1, 2, "ann")
    assert [(x.pair_index, x.labeller) for x in store.labels("r", 1)] == [(0, "ann"), (1, "bob")]
    with pytest.raises(ValueError, match="verdict must be one of"):
        store.put_labels("r", [_label(0, "maybe")])


def test_labels_survive_phase_commits_and_roll_backs_and_a_judge_relabels_its_own(store):
    store.commit_phase("r", 1, "collect", pairs=make_pairs(1, 3))
    store.put_labels("r", [_label(0, "A", "ann")])
    store.commit_phase("r", 1, "label", labels=[_label(0, "B", "judge-m"), _label(1, "A", "judge-m")])
    store.commit_phase("r", 1, "label", labels=[_label(1, "tie", "judge-m")])  # the phase again: its own replaced
    store.commit_phase("r", 1, "select")
    store.discard_after("r", 1, "collect")
    assert [(x.pair_index, x.labeller, x.verdict) for x in store.labels("r")] == [
        (0, "ann", "A"),
        (1, "judge-m", "tie"),
    ]
    rounds = store.rounds("r")
    assert rounds["label_at"].isna().all() and rounds["status"].tolist() == ["collect"]
    store.commit_phase("r", 1, "label")
    assert store.committed_phases("r") == [(1, "collect"), (1, "label")]


def test_a_version_4_store_gains_candidate_breakdowns_and_keeps_its_candidates(tmp_path):
    path = tmp_path / "v4.duckdb"
    with duckdb.connect(str(path)) as con:
        for ddl in schema.TABLES.values():
            con.execute(ddl.replace(VERSION_5_DETAILS, ""))
        con.execute("INSERT INTO schema_version VALUES (4, now())")
        con.execute(
            "INSERT INTO candidates VALUES ('r', 1, 'collect', 0, 'current', 0, ['p'], ['c'], [1], [1], 1.0, 1.0, 'ok')"
        )
    with RunStore(path) as s:
        assert s.readonly_sql("SELECT version FROM schema_version ORDER BY 1")["version"].tolist() == [4, 5]
        old = s.candidates_for_item("r", 1, 0)
        assert old["completions"].tolist() == [["c"]] and old["details_json"].isna().all()


def test_candidate_breakdowns_are_stored_as_json_and_found_for_a_pairs_two_sides(store):
    candidates = make_candidates(2)
    for c in candidates:
        c.details = {"summary": f"{c.side} {c.item_index}.{c.candidate_index}", "tests_passed": c.candidate_index}
    candidates[-1].details = None  # a reward that explained nothing for this one
    pairs = make_pairs(1, 2)  # item 0: current 0 beats comparator 0; item 1: comparator 1 beats current 1
    store.commit_phase("r", 1, "collect", candidates=candidates, pairs=pairs)
    first, second = store.pair_detail("r", 1, 0), store.pair_detail("r", 1, 1)
    assert first["winner_details"] == {"summary": "current 0.0", "tests_passed": 0}
    assert first["loser_details"] == {"summary": "comparator 0.0", "tests_passed": 0}
    assert second["winner_details"] is None  # comparator 1.1 stored no breakdown
    assert second["loser_details"] == {"summary": "current 1.1", "tests_passed": 1}
    stored = store.candidates_for_item("r", 1, 0)["details_json"].map(json.loads).tolist()
    assert [d["summary"] for d in stored] == ["current 0.0", "current 0.1", "comparator 0.0", "comparator 0.1"]


def test_a_version_3_store_gains_the_labels_table(tmp_path):
    path = tmp_path / "v3.duckdb"
    with RunStore(path) as s:
        s.commit_phase("r", 1, "collect", pairs=make_pairs(1, 2))
    with duckdb.connect(str(path)) as con:
        con.execute("DROP TABLE labels")
        con.execute("ALTER TABLE rounds DROP COLUMN label_at")
        con.execute("ALTER TABLE candidates DROP COLUMN details_json")
        con.execute("UPDATE schema_version SET version = 3")
    with RunStore(path) as s:
        assert s.readonly_sql("SELECT version FROM schema_version ORDER BY 1")["version"].tolist() == [3, 4, 5]
        assert s.pairs_count("r") == 2 and s.labels("r") == []
        s.put_labels("r", [_label(1, "A")])
        s.commit_phase("r", 1, "label")
        assert s.rounds("r")["label_at"].notna().all()
