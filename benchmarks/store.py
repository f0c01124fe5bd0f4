"""Benchmark: the DuckDB store at 1,000,000 pairs: bulk commits, the pair browser's page and count queries, exports.

Synthetic pairs are generated inside DuckDB (no Python loop per pair) as one Arrow table per round and committed
through ``RunStore.commit_phase``, one transaction per round, as the engine does. Then:

- page: ``pairs_page`` with 50 rows, filtered by round + winner_side + min reward gap, at random offsets inside the
  filtered set (the pair browser's query); p50 / p95 over ``--queries`` runs;
- count: ``pairs_count`` with the same filters (the browser shows it beside the page);
- text page: the same page with a text search (a full scan of every text), for reference;
- detail: ``pair_detail`` of a random pair;
- exports of all pairs to Parquet and JSONL (and CSV with ``--csv``).

Targets (issue 6): page p95 < 150 ms, Parquet export < 10 s. Usage::

    python benchmarks/store.py [--pairs 1000000] [--rounds 20] [--queries 100] [--csv] [--keep DIR]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa

from comlrl_lab.store import RunStore, export_pairs

RUN = "bench"

# Two agents; prompts come from 500 task items; completions differ per pair and carry md5 hex strings so that they
# do not compress better than real model output. About 600 bytes of text per pair.
GENERATE = """
SELECT
    i::INTEGER AS pair_index,
    (i % 500)::INTEGER AS item_index,
    (i % 4)::INTEGER AS winner_candidate_index,
    (i % 4)::INTEGER AS loser_candidate_index,
    CASE WHEN hash(i, $round) % 2 = 0 THEN 'current' ELSE 'comparator' END AS winner_side,
    ['Item ' || (i % 500) || ': write a helper that parses the config file and returns the section for agent 1.',
     'Item ' || (i % 500) || ': write the tests for the helper agent 1 writes; cover the empty-file case.']
        AS prompts,
    ['def parse_' || i || '(path):\\n    with open(path) as f:\\n        return f.read().split("' || md5(i || 'a' || $round)
        || '")  # ' || md5(i || 'b' || $round),
     'def test_parse_' || i || '():\\n    assert parse_' || i || '("' || md5(i || 'c' || $round) || '") == [""]']
        AS winner_completions,
    ['def parse_' || i || '(path):\\n    return None  # TODO ' || (hash(i) % 1000) || ' ' || md5(i || 'd' || $round),
     'def test_parse_' || i || '():\\n    pass  # ' || md5(i || 'e' || $round)]
        AS loser_completions,
    0.5 + (hash(i, $round, 'w') % 1000) / 2000.0 AS winner_reward,
    (hash(i, $round, 'l') % 1000) / 2000.0 AS loser_reward,
    (winner_reward + loser_reward) / 2 AS candidate_reward_mean,
    [winner_reward, loser_reward] AS raw_rewards,
    CASE WHEN winner_side = 'current' THEN winner_reward ELSE loser_reward END AS target_raw_reward,
    CASE WHEN winner_side = 'current' THEN loser_reward ELSE winner_reward END AS comparator_raw_reward,
    [12 + i % 40, 9 + i % 30] AS winner_token_counts,
    [8 + i % 20, 4 + i % 10] AS loser_token_counts
FROM range($n) t(i)
"""


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--csv", action="store_true", help="also time the CSV export")
    ap.add_argument("--keep", type=Path, default=None, help="keep the store and exports in this directory")
    args = ap.parse_args()

    workdir = args.keep or Path(tempfile.mkdtemp(prefix="comlrl-store-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "bench.duckdb"
    for stale in (db, db.with_name(db.name + ".wal")):
        stale.unlink(missing_ok=True)
    rng = random.Random(0)
    rows: list[tuple[str, str]] = []
    try:
        gen = duckdb.connect()
        per_round = args.pairs // args.rounds
        store = RunStore(db)
        store.create_run(RUN, trainer="MADPOIterTrainer", status="finished")
        gen_s = commit_s = 0.0
        for r in range(1, args.rounds + 1):
            n = per_round if r < args.rounds else args.pairs - per_round * (args.rounds - 1)
            dt, table = timed(lambda r=r, n=n: gen.sql(GENERATE, params={"round": r, "n": n}).to_arrow_table())
            gen_s += dt
            assert isinstance(table, pa.Table)
            dt, _ = timed(lambda r=r, table=table: store.commit_phase(RUN, r, "collect", pairs=table))
            commit_s += dt
        gen.close()
        total = store.pairs_count(RUN)
        assert total == args.pairs, total
        rows.append(("generate pairs in DuckDB", f"{gen_s:.2f} s"))
        rows.append(
            (f"commit {args.rounds} rounds (bulk append)", f"{commit_s:.2f} s ({total / commit_s:,.0f} pairs/s)")
        )
        store.close()
        store = RunStore(db)  # measure reads on a reopened file, as the UI sees it after a restart

        # Filtered page: round + winner side + min gap, random offsets inside the filtered set.
        filters = []
        for _ in range(args.queries):
            flt = {
                "round": rng.randint(1, args.rounds),
                "winner_side": rng.choice(["current", "comparator"]),
                "min_gap": rng.choice([0.0, 0.1, 0.25]),
            }
            filters.append(flt)
        counts = {}
        count_ms = []
        for flt in filters:
            dt, n = timed(lambda flt=flt: store.pairs_count(RUN, **flt))
            count_ms.append(dt * 1000)
            counts[tuple(flt.values())] = n
        store.pairs_page(RUN, **filters[0])  # warm-up
        page_ms = []
        for flt in filters:
            n = counts[tuple(flt.values())]
            offset = rng.randint(0, max(0, n - 50))
            dt, page = timed(lambda flt=flt, offset=offset: store.pairs_page(RUN, **flt, limit=50, offset=offset))
            assert len(page) == min(50, n - offset)
            page_ms.append(dt * 1000)
        text_ms = []
        for flt in filters[: max(5, args.queries // 10)]:
            dt, _ = timed(lambda flt=flt: store.pairs_page(RUN, **flt, text="todo 42", limit=50))
            text_ms.append(dt * 1000)
        detail_ms = []
        for _ in range(args.queries):
            r, i = rng.randint(1, args.rounds), rng.randint(0, per_round - 1)
            dt, d = timed(lambda r=r, i=i: store.pair_detail(RUN, r, i))
            assert d is not None
            detail_ms.append(dt * 1000)
        for name, ms in (
            ("page of 50 (round+side+gap, random offset)", page_ms),
            ("count (same filters)", count_ms),
            ("page of 50 with text search", text_ms),
            ("pair detail", detail_ms),
        ):
            rows.append((name, f"p50 {statistics.median(ms):7.1f} ms   p95 {percentile(ms, 95):7.1f} ms   n={len(ms)}"))

        exports = [("parquet", "pairs.parquet"), ("jsonl", "pairs.jsonl")] + (
            [("csv", "pairs.csv")] if args.csv else []
        )
        export_s = {}
        for fmt, name in exports:
            dest = workdir / name
            dt, n = timed(lambda fmt=fmt, dest=dest: export_pairs(store, RUN, fmt, dest))
            assert n == args.pairs
            export_s[fmt] = dt
            rows.append((f"export all to {fmt}", f"{dt:.2f} s ({dest.stat().st_size / 1e6:,.0f} MB)"))
        store.close()
        rows.append(("DuckDB file", f"{db.stat().st_size / 1e6:,.0f} MB"))

        p95 = percentile(page_ms, 95)
        width = max(len(k) for k, _ in rows)
        print(f"\nstore benchmark: {args.pairs:,} pairs in {args.rounds} rounds, duckdb {duckdb.__version__}")
        for k, v in rows:
            print(f"  {k:<{width}}  {v}")
        print(f"  target page p95 < 150 ms: {'PASS' if p95 < 150 else 'FAIL'} ({p95:.1f} ms)")
        print(
            f"  target Parquet export < 10 s: {'PASS' if export_s['parquet'] < 10 else 'FAIL'} "
            f"({export_s['parquet']:.2f} s)"
        )
    finally:
        if args.keep is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
