"""The SQL box against an attack list: no query reads a file, writes anything, changes a setting or eats the app.

A planted secret sits in every file a query might reach (``./secret.csv``, ``./pg_catalog.secret.csv``, a
``x.information_schema.*.csv`` pattern, Parquet and JSON copies). Each attack must be refused, by the parser
(``ReadOnlyQueryError``) or by DuckDB inside the box (``QueryExecutionError``), without the secret in the message,
a new file, or a change to the store. The box's own guards are also tested with the parser bypassed.
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest
from store_fixtures import make_pairs

from comlrl_lab.store import QueryExecutionError, ReadOnlyQueryError, RunStore, sql_box

SECRET = "planted-secret-5b1e77"


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("planted")
    row = f"a,b\n1,{SECRET}\n"
    for name in ("secret.csv", "pg_catalog.secret.csv", "information_schema.secret.csv", "main.secret.csv"):
        (folder / name).write_text(row)
    (folder / "x.information_schema.a.csv").write_text(row)
    (folder / "secret.json").write_text(f'[{{"a": 1, "b": "{SECRET}"}}]')
    (folder / "secret.txt").write_text(SECRET)
    import duckdb

    with duckdb.connect() as con:
        con.execute(f"COPY (SELECT 1 AS a, '{SECRET}' AS b) TO '{folder / 'secret.parquet'}' (FORMAT parquet)")
    return folder


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory):
    s = RunStore(tmp_path_factory.mktemp("box") / "run.duckdb")
    s.commit_phase("r", 1, "collect", pairs=make_pairs(1, 3))
    yield s
    s.close()


@pytest.fixture
def in_planted(planted, monkeypatch) -> Path:
    monkeypatch.chdir(planted)
    return planted


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


ATTACKS = [
    # -- writes, DDL, settings, transactions (the parser refuses these) ------------------------------------
    "INSERT INTO runs SELECT * FROM runs",
    "INSERT INTO pairs BY NAME SELECT * FROM pairs",
    "UPDATE pairs SET round = 2",
    "DELETE FROM pairs",
    "DROP TABLE pairs",
    "DROP VIEW pair_records",
    "CREATE TABLE x (a INT)",
    "CREATE TEMP TABLE x AS SELECT 1",
    "CREATE OR REPLACE VIEW pairs2 AS SELECT 1",
    "CREATE MACRO m(a) AS a",
    "CREATE SEQUENCE s",
    "CREATE SCHEMA s",
    "CREATE TYPE mood AS ENUM ('a')",
    "CREATE INDEX i ON pairs (round)",
    "CREATE SECRET s (TYPE s3, KEY_ID 'k', SECRET 'v')",
    "ALTER TABLE pairs ADD COLUMN q INT",
    "ALTER TABLE pairs RENAME TO p",
    "ATTACH 'other.duckdb' AS other",
    "ATTACH 'secret.csv' AS other (READ_ONLY)",
    "DETACH other",
    "COPY pairs TO 'out.csv'",
    "COPY (SELECT 1) TO 'out.parquet' (FORMAT parquet)",
    "COPY pairs FROM 'secret.csv'",
    "EXPORT DATABASE 'dump'",
    "IMPORT DATABASE 'dump'",
    "INSTALL httpfs",
    "FORCE INSTALL httpfs",
    "LOAD httpfs",
    "SET threads = 1",
    "SET memory_limit = '100GB'",
    "SET enable_external_access = true",
    "SET GLOBAL lock_configuration = false",
    "RESET threads",
    "PRAGMA version",
    "PRAGMA memory_limit = '100GB'",
    "CALL pragma_version()",
    "CHECKPOINT",
    "FORCE CHECKPOINT",
    "VACUUM",
    "TRUNCATE pairs",
    "USE memory",
    "BEGIN TRANSACTION",
    "COMMIT",
    "ROLLBACK",
    "PREPARE p AS SELECT 1",
    "EXECUTE p",
    "DEALLOCATE p",
    "SELECT 1; DROP TABLE pairs",
    "SELECT 1 /* ; */ ; DELETE FROM pairs",
    "SELECT 1 -- harmless\n; DELETE FROM pairs",
    "WITH gone AS (DELETE FROM pairs RETURNING *) SELECT * FROM gone",
    "WITH x AS (SELECT 1) INSERT INTO runs SELECT * FROM runs",
    "WITH u AS (UPDATE pairs SET round = 9 RETURNING *) SELECT count(*) FROM u",
    "SELECT nextval('seq')",
    "SELECT setseed(0.5)",
    # -- files: table functions, literals, quoted names and the catalog fall-backs --------------------------
    "SELECT * FROM read_csv('secret.csv')",
    "SELECT * FROM read_csv_auto('secret.csv')",
    "SELECT * FROM ReAd_CsV('secret.csv')",
    "SELECT * FROM \"read_csv\"('secret.csv')",
    "SELECT * FROM read_csv/**/('secret.csv')",
    "SELECT * FROM read_csv(['secret.csv'])",
    "SELECT * FROM read_csv('secret' || '.csv')",
    "SELECT * FROM read_parquet('secret.parquet')",
    "SELECT * FROM parquet_scan('secret.parquet')",
    "SELECT * FROM parquet_metadata('secret.parquet')",
    "SELECT * FROM parquet_schema('secret.parquet')",
    "SELECT * FROM read_json('secret.json')",
    "SELECT * FROM read_json_auto('secret.json')",
    "SELECT * FROM read_text('secret.txt')",
    "SELECT * FROM read_blob('secret.txt')",
    "SELECT * FROM glob('*')",
    "SELECT * FROM sniff_csv('secret.csv')",
    "SELECT * FROM 'secret.csv'",
    'SELECT * FROM "secret.csv"',
    "FROM 'secret.parquet'",
    "FROM 'secret.csv' SELECT *",
    "SELECT * FROM 'secret.*'",
    "SELECT * FROM '/etc/hosts'",
    "SELECT * FROM 'https://example.com/x.csv'",
    "SELECT * FROM 's3://bucket/x.parquet'",
    'SELECT * FROM pg_catalog."secret.csv"',
    'SELECT * FROM information_schema."secret.csv"',
    'SELECT * FROM main."secret.csv"',
    'SELECT * FROM memory.main."secret.csv"',
    'SELECT * FROM "x".information_schema."*.csv"',
    'SELECT * FROM "x".information_schema."a.csv"',
    'SELECT * FROM "x".pg_catalog.pg_tables',
    'DESCRIBE pg_catalog."secret.csv"',
    "DESCRIBE 'secret.csv'",
    "SUMMARIZE 'secret.csv'",
    "SUMMARIZE SELECT * FROM 'secret.csv'",
    "SHOW SELECT * FROM read_csv('secret.csv')",
    "EXPLAIN SELECT * FROM 'secret.csv'",
    "EXPLAIN ANALYZE SELECT * FROM read_csv('secret.csv')",
    "PIVOT 'secret.csv' ON a USING first(b)",
    "WITH pairs AS (SELECT * FROM 'secret.csv') SELECT * FROM pairs",
    "SELECT (SELECT max(b) FROM 'secret.csv')",
    "SELECT * FROM pairs, 'secret.csv'",
    "SELECT round FROM pairs UNION ALL SELECT b FROM 'secret.csv'",
    "SELECT * FROM pairs WHERE round IN (SELECT a FROM read_csv('secret.csv'))",
    "SELECT * FROM range(1), LATERAL (SELECT * FROM 'secret.csv')",
    "SELECT * FROM query('SELECT * FROM secret')",
    "SELECT * FROM query_table('secret.csv')",
    "SELECT * FROM sqlite_scan('x.db', 't')",
    "SELECT * FROM postgres_scan('', 'public', 't')",
    "SELECT * FROM delta_scan('x')",
    "SELECT * FROM iceberg_scan('x')",
    "SELECT * FROM json_execute_serialized_sql('{}')",
    "SELECT * FROM duckdb_secrets()",
    "SELECT * FROM duckdb_extensions()",
    "SELECT * FROM pragma_database_list()",
    "SELECT * FROM secret",
    "SELECT getenv('HOME')",
    "SELECT * FROM no_such_table",
    # -- not a single parseable statement ---------------------------------------------------------------------
    "",
    "SELEC * FROM pairs",
]

# Reads that pass the parser and must be stopped by the box's limits (memory, bytes, time).
RESOURCE_ATTACKS = [
    ("SELECT repeat('x', 20000000) FROM range(100)", "needed more than"),
    ("SELECT repeat('x', 2000000) FROM range(100)", "larger than"),
    ("SELECT list(range) FROM range(400000000)", "needed more than"),
    ("SELECT string_agg(repeat('y', 1000), ',') FROM range(3000000)", "needed more than|larger than"),
]


def test_the_attack_list_is_long_enough():
    assert len(ATTACKS) + len(RESOURCE_ATTACKS) >= 80
    assert len(set(ATTACKS)) == len(ATTACKS)


@pytest.mark.parametrize("query", ATTACKS)
def test_attack_is_refused_and_reads_nothing(shared_store, in_planted, query):
    before = _files(in_planted)
    with pytest.raises((ReadOnlyQueryError, QueryExecutionError)) as info:
        df = shared_store.readonly_sql(query)
        pytest.fail(f"accepted, returned {df.to_dict('records')[:3]}")
    assert SECRET not in str(info.value)
    assert _files(in_planted) == before
    assert shared_store.pairs_count("r") == 3


@pytest.mark.parametrize(("query", "reason"), RESOURCE_ATTACKS)
def test_a_heavy_read_is_stopped_in_the_box_not_in_the_app(shared_store, query, reason):
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    with pytest.raises(QueryExecutionError, match=reason):
        shared_store.readonly_sql(query)
    assert time.monotonic() - start < 30
    # ru_maxrss is in KiB: the app's own peak grows by less than 200 MB (it was 8.3 GB before the box).
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 200 * 1024


def test_the_time_limit_stops_the_box(shared_store):
    start = time.monotonic()
    with pytest.raises(QueryExecutionError, match="longer than"):
        shared_store.readonly_sql("SELECT sum(hash(range)) FROM range(100000000000)", timeout_s=1.5)
    assert time.monotonic() - start < 10


# With the parser bypassed, DuckDB's own guards inside the box still refuse files, settings and extensions.
BOX_ONLY = [
    ("SELECT * FROM read_csv('secret.csv')", "disabled"),
    ("SELECT * FROM 'secret.csv'", "disabled|does not exist"),
    ('SELECT * FROM pg_catalog."secret.csv"', "disabled"),
    ('SELECT * FROM "x".information_schema."*.csv"', "disabled|does not exist"),
    ('DESCRIBE pg_catalog."secret.csv"', "disabled"),
    ("COPY (SELECT 1) TO 'out.csv'", "disabled"),
    ("ATTACH 'other.duckdb'", "disabled"),
    ("SET enable_external_access = true", "configuration has been locked|Cannot change"),
    ("SET memory_limit = '100GB'", "configuration has been locked"),
    ("SET threads = 64", "configuration has been locked"),
    ("INSTALL httpfs", "disabled|locked|not allowed|Permission"),
]


@pytest.mark.parametrize(("statement", "reason"), BOX_ONLY)
def test_the_box_refuses_on_its_own(in_planted, statement, reason):
    before = _files(in_planted)
    with sql_box.Box() as box, pytest.raises(sql_box.BoxError, match=reason) as info:
        box.run(statement, limit=10, timeout_s=30)
    assert SECRET not in str(info.value)
    assert _files(in_planted) == before


def test_reads_still_work_and_report_the_row_limit(shared_store):
    df = shared_store.readonly_sql("SELECT round, count(*) AS n FROM pairs GROUP BY round")
    assert df.to_dict("records") == [{"round": 1, "n": 3}]
    assert set(shared_store.readonly_sql("SHOW TABLES")["name"]) >= {"pairs", "runs", "pair_records"}
    assert shared_store.readonly_sql("SELECT * FROM range(5)", limit=2).attrs["truncated"] is True
    assert len(shared_store.readonly_sql("SELECT * FROM information_schema.columns WHERE table_name = 'pairs'")) > 5


def test_one_box_process_answers_query_after_query_and_a_stopped_one_is_replaced(shared_store):
    # Starting a box costs an interpreter and the import of duckdb and pyarrow (about a second): it is reused.
    sql_box._CHILDREN.close()
    shared_store.readonly_sql("SELECT 1 AS x")
    (first,) = sql_box._CHILDREN._idle[sql_box.MEMORY_LIMIT_BYTES]
    assert shared_store.readonly_sql("SELECT 2 AS x")["x"].tolist() == [2]
    assert sql_box._CHILDREN._idle[sql_box.MEMORY_LIMIT_BYTES] == [first] and first.answered == 2
    # A refused statement leaves the box usable; one that overran its time is killed and not reused.
    with pytest.raises(QueryExecutionError):
        shared_store.readonly_sql("SELECT 1 / 'x'")  # passes the parser, fails in DuckDB
    assert first.proc.poll() is None and first.answered == 3
    with pytest.raises(QueryExecutionError, match="longer than"):
        shared_store.readonly_sql("SELECT sum(hash(range)) FROM range(100000000000)", timeout_s=1.0)
    assert first.proc.poll() is not None
    assert shared_store.readonly_sql("SELECT 3 AS x")["x"].tolist() == [3]
    (second,) = sql_box._CHILDREN._idle[sql_box.MEMORY_LIMIT_BYTES]
    assert second is not first and second.answered == 1
