"""A headless MARLHFIter run on a built-in task with the embedded tiny model, printing its learning curve.

    python scripts/marlhf_curve.py                       # 4 rounds of length_ratio, magrpo, seed 0
    python scripts/marlhf_curve.py --task topic_relay --algorithm iac --rounds 6

Per round it prints the pairs collected, the Bradley-Terry fit of that round's fresh reward model (training and
held-out accuracy after the last BT epoch), the reward model's mean score during policy learning, and the task
reward of fresh samples on the eval items (the task reward only, never the reward model). Round 0 is the
untrained policy. Everything runs on the CPU unless ``--device`` says otherwise, with no network.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from comlrl_lab.data.tasks import get_task, list_tasks  # noqa: E402
from comlrl_lab.engine import ExperimentSpec, build_trainer  # noqa: E402
from comlrl_lab.names.run_ids import new_run_id  # noqa: E402
from comlrl_lab.trainers.preference.sink import MemorySink  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="length_ratio", choices=list_tasks())
    parser.add_argument("--model", default="comlrl-lab/tiny")
    parser.add_argument("--algorithm", default="magrpo", help="rl_algorithm")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--train-items", type=int, default=64)
    parser.add_argument("--eval-items", type=int, default=60)
    parser.add_argument("--candidates", type=int, default=8, help="preference_num_candidates")
    parser.add_argument("--pairs-per-item", type=int, default=8, help="preference_pairs_per_sample")
    parser.add_argument("--pair-selection", default="reward_gap")
    parser.add_argument("--generations", type=int, default=4, help="num_generations")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--agent-lr", type=float, default=5e-4)
    parser.add_argument("--reward-lr", type=float, default=1e-3)
    parser.add_argument("--reward-epochs", type=int, default=4)
    parser.add_argument("--rl-epochs", type=int, default=1)
    parser.add_argument("--replay-mode", default="all_history")
    parser.add_argument("--replay-sample-size", type=int, default=800, help="preference_replay_sample_size")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default=None, help="run directory (default: a temporary one)")
    return parser.parse_args(argv)


def last(records, name: str) -> float:
    values = [m["value"] for r in records for m in r.metrics if m["name"] == name]
    return values[-1] if values else math.nan


def main(argv: list[str] | None = None) -> dict[str, list[float]]:
    args = parse_args(argv)
    task = get_task(args.task)
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="marlhf_curve_")
    config = dict(
        rl_algorithm=args.algorithm,
        num_iterations=args.rounds,
        num_generations=args.generations,
        preference_num_candidates=args.candidates,
        preference_pairs_per_sample=args.pairs_per_item,
        preference_replay_mode=args.replay_mode,
        preference_replay_sample_size=args.replay_sample_size,
        pair_selection=args.pair_selection,
        max_new_tokens=args.max_new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        agent_learning_rate=args.agent_lr,
        reward_learning_rate=args.reward_lr,
        reward_num_train_epochs=args.reward_epochs,
        reward_train_batch_size=8,
        num_train_epochs=args.rl_epochs,
        rollout_buffer_size=4,
        train_batch_size=4,
        eval_num_samples=args.eval_items,
        agent_devices=args.device,
        bt_validation_fraction=0.25,
        seed=args.seed,
    )
    spec = ExperimentSpec(
        algorithm="MARLHFIter",
        agent_models=[args.model] * task.num_agents,
        task=args.task,
        config=config,
        max_train_items=args.train_items,
    )
    sink = MemorySink()
    started = time.monotonic()
    trainer = build_trainer(spec, output_dir=output_dir, run_id=new_run_id("marlhf-curve"), sink=sink)
    curve: dict[str, list[float]] = {"bt_val_accuracy": [math.nan], "eval_reward": []}
    curve["eval_reward"].append(trainer.evaluate()["eval/turn_1/reward_mean"])
    print(
        f"MARLHFIter on {args.task}, {args.algorithm}, seed {args.seed}, {args.train_items} train items, "
        f"{args.eval_items} eval items; run dir {output_dir}"
    )
    header = f"{'round':>5} {'pairs':>5} {'BT pairs':>8} {'val':>4} {'BT acc':>7} {'BT val acc':>10} {'BT val loss':>11} {'RM mean':>8} {'eval reward':>11} {'seconds':>8}"
    print(header)
    print(
        f"{0:>5} {'':>5} {'':>8} {'':>4} {'':>7} {'':>10} {'':>11} {'':>8} {curve['eval_reward'][0]:>11.4f} {time.monotonic() - started:>8.1f}"
    )
    while not trainer.finished:
        round_index = trainer.round_index
        records = [trainer.step() for _ in range(4)]  # collect, select, train, evaluate
        curve["bt_val_accuracy"].append(last(records, "bt/val_accuracy"))
        curve["eval_reward"].append(last(records, "eval/turn_1/reward_mean"))
        print(
            f"{round_index:>5} {len(records[0].pairs):>5} {int(last(records, 'iter/train_preference_pairs')):>8} {int(last(records, 'bt/val_pairs')):>4} "
            f"{last(records, 'bt/accuracy'):>7.3f} {curve['bt_val_accuracy'][-1]:>10.3f} {last(records, 'bt/val_loss'):>11.4f} "
            f"{last(records, 'round/rl/reward_model_mean'):>8.3f} {curve['eval_reward'][-1]:>11.4f} {time.monotonic() - started:>8.1f}",
            flush=True,
        )
    final_acc, rewards = curve["bt_val_accuracy"][-1], curve["eval_reward"]
    print(f"BT held-out accuracy, last round: {final_acc:.3f} ({'above' if final_acc > 0.7 else 'NOT above'} 0.7)")
    print(
        f"eval task reward: {' -> '.join(f'{r:.4f}' for r in rewards)} "
        f"({'rising' if rewards[-1] > rewards[0] else 'NOT rising'}); wall time {time.monotonic() - started:.0f} s"
    )
    return curve


if __name__ == "__main__":
    main()
