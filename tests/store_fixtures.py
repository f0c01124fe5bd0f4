"""Small deterministic records for the store tests (no torch, no models)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from comlrl_lab.data.records import JointCandidate, PreferencePair


def make_pairs(round_index: int, count: int, *, num_agents: int = 2) -> list[PreferencePair]:
    """``count`` pairs of one round; odd items are won by the comparator, gaps grow with the item index."""
    pairs = []
    for n in range(count):
        current_wins = n % 2 == 0
        hi, lo = 1.0 + n / 4, 0.25
        pairs.append(
            PreferencePair(
                prompts=[f"問題 {n} for agent {a}" for a in range(num_agents)],
                winner_completions=[
                    f'勝ち r{round_index} #{n} a{a} "quoted", comma\nnewline' for a in range(num_agents)
                ],
                loser_completions=[f"loser r{round_index} #{n} a{a}" for a in range(num_agents)],
                winner_reward=hi,
                loser_reward=lo,
                candidate_reward_mean=(hi + lo) / 2,
                raw_rewards=[hi * 2, lo * 2],
                target_raw_reward=hi * 2 if current_wins else lo * 2,
                comparator_raw_reward=lo * 2 if current_wins else hi * 2,
                round_index=round_index,
                item_index=n,
                winner_candidate_index=n % 3,
                loser_candidate_index=n % 3,
                winner_side="current" if current_wins else "comparator",
                prompt_ids=[[1, 2, 3]] * num_agents,
                winner_ids=[[4] * (n + 1)] * num_agents,
                loser_ids=[[5, 6]] * num_agents,
            )
        )
    return pairs


def make_candidates(num_items: int, num_candidates: int = 2, *, num_agents: int = 2) -> list[JointCandidate]:
    out = []
    for item in range(num_items):
        for side in ("current", "comparator"):
            for c in range(num_candidates):
                out.append(
                    JointCandidate(
                        item_index=item,
                        candidate_index=c,
                        side=side,
                        prompts=[f"p{item} a{a}" for a in range(num_agents)],
                        completions=[f"{side} {item}.{c} a{a}" for a in range(num_agents)],
                        completion_ids=[[7] * (c + a + 1) for a in range(num_agents)],
                        prompt_ids=[[1, 2] for _ in range(num_agents)],
                        raw_reward=float(c) + (0.5 if side == "current" else 0.0),
                        reward=float(c),
                        parse_status="ok" if c < num_candidates - 1 or side == "current" else "unparsed",
                    )
                )
    return out


def fresh_path(tmp_path: Path, name: str = "run.duckdb") -> Path:
    return tmp_path / name


#: Pairs per collect phase in the crash tests: large enough that a commit takes a noticeable time.
CRASH_PAIRS = 1500


def phase_payload(round_index: int, phase: str, *, pairs_per_round: int = CRASH_PAIRS) -> dict:
    """The deterministic records one phase commits in the crash tests (what a resumed run would produce again)."""
    if phase == "collect":
        return {
            "pairs": make_pairs(round_index, pairs_per_round),
            "candidates": make_candidates(40),
            "metrics": [{"step": 0, "name": f"turn_1/{k}", "value": float(round_index)} for k in ("a", "b", "c")],
            "events": [{"level": "info", "message": f"collected round {round_index}"}],
        }
    if phase == "select":
        return {
            "replay_rows": [
                {"source_round": s, "mode": "all_history", "weight": 1.0 / round_index, "drawn_count": 10}
                for s in range(1, round_index + 1)
            ],
            "metrics": [{"step": 0, "name": "iter/train_preference_pairs", "value": 10.0 * round_index}],
        }
    if phase == "train":
        return {"metrics": [{"step": s, "name": "train/loss", "value": 1.0 / (s + 1)} for s in range(25)]}
    return {"metrics": [{"step": 25, "name": "eval/turn_1/reward_mean", "value": 0.1 * round_index}]}


def expected_counts(round_index: int, phase: str, *, pairs_per_round: int = CRASH_PAIRS) -> dict[str, int]:
    payload = phase_payload(round_index, phase, pairs_per_round=pairs_per_round)
    keys = {
        "candidates": "candidates",
        "pairs": "pairs",
        "replay": "replay_rows",
        "metrics": "metrics",
        "events": "events",
    }
    return {table: len(payload.get(key, [])) for table, key in keys.items()}


@contextlib.contextmanager
def held_store(path: Path) -> Iterator[subprocess.Popen]:
    """Another process holding the DuckDB file ``path`` read-write (as the workbench holds the runs it shows), until
    the block ends; yields that process."""
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb, time; c = duckdb.connect({str(path)!r}); print(1, flush=True); "
         "time.sleep(60)"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == b"1"
        yield holder
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
