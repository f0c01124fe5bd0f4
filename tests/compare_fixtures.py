"""Synthetic run folders for the Compare page: a spec.json and Parquet snapshots laid out as the engine writes them.

No model and no DuckDB file: the Compare page reads only these, so its tests and its benchmark build any number
of runs in milliseconds with values chosen by hand.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from comlrl_lab.engine import ExperimentSpec
from comlrl_lab.names import metric_names as mn


def write_spec(
    run_dir: Path, config: dict, *, tags: Sequence[str] = (), algorithm: str = "MADPOIter", task: str = "length_ratio"
) -> None:
    """The run's spec.json alone: a run that was created and never started."""
    ExperimentSpec(algorithm=algorithm, task=task, config=dict(config), tags=list(tags)).save(run_dir / "spec.json")


def write_run(
    root: Path,
    run_id: str,
    *,
    config: dict,
    rounds: int,
    eval_reward: Callable[[int], float],
    tags: Sequence[str] = (),
    algorithm: str = "MADPOIter",
    task: str = "length_ratio",
    pairs_per_round: int = 4,
    current_wins: int = 1,
    gap: float = 0.5,
    status: str = "finished",
    eval_extra: Callable[[int], dict[str, float]] | None = None,
) -> Path:
    """A run of ``rounds`` rounds (``status`` in its runs.parquet: finished unless told); ``eval_reward(r)`` is its
    evaluation reward in round r.

    Every other curve is a fixed function of the round (loss 1/r, pair accuracy r/rounds, ...), and each round has
    ``pairs_per_round`` pairs of which the first ``current_wins`` are won by the current agents, all with ``gap``.
    ``eval_extra(r)``: more metrics of round r's evaluate phase (a code task's ``eval/code/*``).
    """
    run_dir = root / run_id
    snaps = run_dir / "snapshots"
    (snaps / "metrics").mkdir(parents=True)
    (snaps / "pairs").mkdir()
    write_spec(run_dir, config, tags=tags, algorithm=algorithm, task=task)
    manifest = {}
    for r in range(1, rounds + 1):
        for phase, values in (
            (
                "collect",
                {mn.REWARD_MEAN: 0.3 + 0.01 * r, mn.CURRENT_WIN_SHARE: current_wins / pairs_per_round},
            ),
            (
                "train",
                {
                    mn.ROUND_PREFIX + mn.MADPO_LOSS: 1.0 / r,
                    mn.ROUND_PREFIX + mn.MADPO_PAIR_ACCURACY: r / rounds,
                    mn.ROUND_PREFIX + mn.MADPO_JOINT_MARGIN: -1.0 + 0.1 * r,
                    mn.MADPO_LOSS: 99.0,  # a per-update metric: never a round curve
                },
            ),
            (
                "evaluate",
                {mn.EVAL_REWARD_MEAN: eval_reward(r), mn.EVAL_NUM_SAMPLES: 64, **(eval_extra(r) if eval_extra else {})},
            ),
        ):
            frame = pd.DataFrame(
                {
                    "run_id": run_id,
                    "round": r,
                    "phase": phase,
                    "step": r,
                    "name": list(values),
                    "value": [float(v) for v in values.values()],
                }
            )
            frame.to_parquet(snaps / "metrics" / f"round_{r:04d}_{phase}.parquet")
            manifest[f"round_{r:04d}_{phase}"] = f"t{r}{phase}"
        pd.DataFrame(
            {
                "run_id": run_id,
                "round": r,
                "phase": "collect",
                "pair_index": range(pairs_per_round),
                "winner_side": ["current" if i < current_wins else "comparator" for i in range(pairs_per_round)],
                "reward_gap": gap,
                "winner_token_counts": [[3, 5]] * pairs_per_round,
                "loser_token_counts": [[2, 2]] * pairs_per_round,
            }
        ).to_parquet(snaps / "pairs" / f"round_{r:04d}_collect.parquet")
    pd.DataFrame({"run_id": [run_id], "status": [status]}).to_parquet(snaps / "runs.parquet")
    (snaps / "_manifest.json").write_text(json.dumps({"run_id": run_id, "phases": manifest}), encoding="utf-8")
    return run_dir
