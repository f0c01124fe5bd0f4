"""MADPOIter on the tiny random model for tests/test_distributed.py: run it under torchrun or in-process.

``run()`` builds the trainer, records what this rank collected itself (its shard of every collection phase,
before the gather), steps phase by phase and dumps to ``out_dir``: ``rank<r>.pt`` with the local rows, the
round pairs, the replay draws and the agents' weights after each round. Under torchrun every rank dumps its own
file; ``--copy-checkpoint-after`` copies the checkpoint and run directory of that round aside (``round<t>/``),
for a resume with another world size.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer_fixtures import ITEMS, build_trainer  # noqa: E402

#: Two rounds on five items against the history comparator, lambda-decay replay of 7 pairs, 3 pairs per step (slices
#: of 2 and 1 on two ranks).
DIST = dict(
    train_dataset=ITEMS[:5],
    num_iterations=2,
    preference_pairs_per_sample=2,
    agent_learning_rate=1e-2,
    train_batch_size=3,
    eval_num_samples=3,
    comparator_policy="history",
    preference_replay_mode="lambda_decay",
    preference_replay_lambda=0.5,
    preference_replay_sample_size=7,
    seed=11,
    run_id="dist-run",
)


def candidate_key(c):
    return (
        c.item_index,
        c.side,
        c.candidate_index,
        tuple(c.completions),
        tuple(map(tuple, c.completion_ids)),
        c.raw_reward,
    )


def pair_key(p):
    return (
        p.round_index,
        p.item_index,
        p.winner_side,
        p.winner_candidate_index,
        tuple(p.winner_completions),
        tuple(p.loser_completions),
        p.winner_reward,
        p.loser_reward,
    )


def weights(trainer):
    return [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in trainer.agents]


def run(model_dir: str, out_dir: Path, *, resume: Path | None = None, copy_checkpoint_after: int | None = None) -> dict:
    torch.set_num_threads(1)
    out_dir = Path(out_dir)
    trainer = build_trainer("MADPOIter", model_dir, out_dir, DIST)
    trainer.checkpoint_dir = out_dir / "ckpt"
    if resume is not None:
        trainer.load_checkpoint(resume)
    local_rows: dict[int, list] = {}
    gather = trainer.context.gather_rows

    def recording(rows):
        if trainer.next_phase == "collect":
            flat = []
            for row in rows:
                for side_row in row if isinstance(row, tuple) else (row,):
                    flat.extend(candidate_key(c) for c in side_row)
            local_rows.setdefault(trainer.round_index, []).extend(flat)
        return gather(rows)

    trainer.context.gather_rows = recording
    dump: dict = {
        "rank": trainer.dist.rank,
        "world_size": trainer.dist.world_size,
        "pairs": {},
        "drawn": {},
        "weights": {},
    }
    while not trainer.finished:
        round_index, phase = trainer.round_index, trainer.next_phase
        trainer.step()
        if phase == "collect":
            dump["pairs"][round_index] = [pair_key(p) for p in trainer.collector.round_pairs]
        elif phase == "select":
            dump["drawn"][round_index] = [pair_key(p) for p in trainer.collector.train_pairs]
        elif phase == "train":
            dump["weights"][round_index] = weights(trainer)
        elif phase == "evaluate" and copy_checkpoint_after == round_index:
            if trainer.dist.is_main:  # the checkpoint and the run directory (policy snapshots, replay files)
                shutil.copytree(trainer.checkpoint_dir, out_dir / f"round{round_index}" / "ckpt")
                shutil.copytree(out_dir / "out", out_dir / f"round{round_index}" / "out")
            trainer.dist.barrier()
    dump["local_rows"] = local_rows
    dump["replay_dir"] = (
        None if trainer.collector.replay.replay_dir is None else str(trainer.collector.replay.replay_dir)
    )
    torch.save(dump, out_dir / f"rank{trainer.dist.rank}.pt")
    return dump


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--copy-checkpoint-after", type=int)
    args = parser.parse_args()
    run(args.model_dir, Path(args.out_dir), copy_checkpoint_after=args.copy_checkpoint_after)


if __name__ == "__main__":
    main()
