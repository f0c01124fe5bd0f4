"""MARLHF on the tiny random model for tests/test_distributed.py: run it under torchrun or in-process.

``run()`` trains one MARLHF round (collect, select, train) and dumps to ``out_dir/rank<r>.pt``: the fitted
reward model's weights, the agents' weights, every bt/ and rl/ metric of the train phase, and how many rows
this rank itself pushed through the Bradley-Terry fit (pairs, validation included), the rollout sampler (items),
the reward model's scoring of the rollouts and the policy-gradient forwards, so the test can tell that the ranks split the work.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer_fixtures import ITEMS, build_trainer  # noqa: E402

from comlrl_lab.trainers.preference.learning import policy_learning, reward_model  # noqa: E402
from comlrl_lab.trainers.preference.marlhf import RLHFLearner  # noqa: E402

#: One round on the five items of dist_madpo_script, 3 pairs per Bradley-Terry step and 3 samples per policy step
#: (slices of 2 and 1 on two ranks), a KL penalty, no evaluation.
DIST = dict(
    train_dataset=ITEMS[:5],
    eval_dataset=None,
    preference_pairs_per_sample=2,
    agent_learning_rate=1e-2,
    reward_learning_rate=1e-2,
    reward_train_batch_size=3,
    reward_num_train_epochs=2,
    bt_validation_fraction=0.25,
    num_generations=3,
    rollout_buffer_size=3,
    train_batch_size=3,
    reference_kl_enabled=True,
    scoring_batch_size=2,
    eval_num_samples=0,
    seed=13,
    run_id="dist-marlhf",
)


@contextlib.contextmanager
def counting(counts: dict):
    """Count the rows through the Bradley-Terry forwards, the rollout sampling and scoring, the policy forwards."""
    patches = [
        (reward_model, "_bt_batch", "bt_pairs", lambda model, winners, losers, micro: len(winners)),
        (RLHFLearner, "reward_scores", "reward_rows", lambda self, candidates: len(candidates)),
        (
            policy_learning,
            "sample_joint_candidates",
            "rollout_items",
            lambda models, tok, prompts, *a, **k: len(prompts[0]),
        ),
        (policy_learning, "token_logps_and_mask", "policy_rows", lambda model, prompts, *a, **k: len(prompts)),
    ]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _, _ in patches]

    def wrap(original, key, rows):
        def wrapper(*args, **kwargs):
            counts[key] += rows(*args, **kwargs)
            return original(*args, **kwargs)

        return wrapper

    for (owner, name, key, rows), (_, _, original) in zip(patches, originals):
        setattr(owner, name, wrap(original, key, rows))
    try:
        yield
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def run(model_dir: str, out_dir: Path) -> dict:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    counts = {"bt_pairs": 0, "rollout_items": 0, "reward_rows": 0, "policy_rows": 0}
    with counting(counts):
        return _run(model_dir, out_dir, counts)


def _run(model_dir: str, out_dir: Path, counts: dict) -> dict:
    trainer = build_trainer("MARLHF", model_dir, out_dir, DIST)
    metrics = []
    for phase in ("collect", "select", "train"):
        if phase == "train":  # rollout scoring during collection is the task reward's, not counted
            counts.update(bt_pairs=0, rollout_items=0, reward_rows=0, policy_rows=0)
        records = trainer.step(phase)
        if phase == "train":
            metrics = [(m["step"], m["name"], m["value"]) for m in records.metrics if not m["name"].startswith("time/")]
    dump = {
        "rank": trainer.dist.rank,
        "world_size": trainer.dist.world_size,
        "num_pairs": len(trainer.collector.train_pairs),
        "reward_model": {k: v.detach().clone() for k, v in trainer.learner.reward_model.state_dict().items()},
        "agents": [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in trainer.agents],
        "metrics": metrics,
        "counts": counts,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save(dump, out_dir / f"rank{trainer.dist.rank}.pt")
    trainer.dist.shutdown()
    return dump


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("out_dir")
    args = parser.parse_args()
    run(args.model_dir, Path(args.out_dir))


if __name__ == "__main__":
    main()
