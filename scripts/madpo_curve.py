"""A headless MADPOIter run on a built-in task with the embedded tiny model; prints the learning curve.

Usage: ``python scripts/madpo_curve.py [--task length_ratio] [--rounds 5]``. Each round prints the mean task
reward of the collected candidates, the pairs, the DPO loss and accuracy, and the eval task reward (fresh
samples on the eval split, never a learned model). The run directory keeps the replay files.
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time

import torch

from comlrl_lab.data.tasks import get_task
from comlrl_lab.engine import ExperimentSpec, build_trainer
from comlrl_lab.models.tiny_model import TINY_MODEL_NAME
from comlrl_lab.names.run_ids import new_run_id
from comlrl_lab.trainers.preference.runtime.sink import MemorySink


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="length_ratio")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--items", type=int, default=64)
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--comparator", default="current")
    parser.add_argument("--replay", default="lambda_decay")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)

    task = get_task(args.task)
    replay = {"preference_replay_mode": args.replay}
    if args.replay == "lambda_decay":
        replay["preference_replay_lambda"] = 0.5
    config = dict(
        num_iterations=args.rounds,
        preference_num_candidates=args.candidates,
        preference_pairs_per_sample=4,
        num_train_epochs=args.epochs,
        agent_learning_rate=args.lr,
        dpo_beta=args.beta,
        train_batch_size=8,
        max_new_tokens=48,
        temperature=1.0,
        top_p=1.0,
        eval_num_samples=len(task.eval_items()),
        comparator_policy=args.comparator,
        agent_devices="cpu",
        seed=args.seed,
        **replay,
    )
    spec = ExperimentSpec(
        algorithm="MADPOIter",
        agent_models=[TINY_MODEL_NAME] * task.num_agents,
        task=args.task,
        config=config,
        max_train_items=args.items,
    )
    sink = MemorySink()
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="madpo-curve-")
    trainer = build_trainer(spec, output_dir=output_dir, run_id=new_run_id("madpo-curve"), sink=sink)
    baseline = trainer.evaluate()["eval/turn_1/reward_mean"]
    print(
        f"task={args.task} rounds={args.rounds} items={args.items} N={args.candidates} lr={args.lr} "
        f"beta={args.beta} epochs={args.epochs} comparator={args.comparator} replay={args.replay}"
    )
    print(f"round 0: eval reward {baseline:.3f}")
    started = time.perf_counter()
    while not trainer.finished:
        round_index = trainer.round_index
        for _ in range(4):
            trainer.step()
        values = {
            m["name"]: m["value"] for phase in sink.phases if phase.round_index == round_index for m in phase.metrics
        }
        print(
            f"round {round_index}: candidates {values.get('turn_1/reward_mean', math.nan):.3f}  "
            f"pairs {int(values.get('iter/current_preference_pairs', 0))}  "
            f"trained {int(values.get('iter/train_preference_pairs', 0))}  "
            f"loss {values.get('round/madpo/loss', math.nan):.3f}  "
            f"acc {values.get('round/madpo/pair_accuracy', math.nan):.2f}  "
            f"eval reward {values.get('eval/turn_1/reward_mean', math.nan):.3f}",
            flush=True,
        )
    print(f"wall time {time.perf_counter() - started:.1f} s; run directory {output_dir}")


if __name__ == "__main__":
    main()
