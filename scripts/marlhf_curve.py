"""Headless MARLHFIter runs on a built-in task with the embedded tiny model, printing their learning curves.

    python scripts/marlhf_curve.py                       # the MARLHF quickstart preset: 4 rounds of length_ratio
    python scripts/marlhf_curve.py --seeds 3             # the same over seeds 0-2, with the rise as mean ± 95% CI
    python scripts/marlhf_curve.py --task topic_relay --algorithm iac --rounds 6

The defaults are the MARLHF quickstart preset's (``engine/presets.py``), so the plain command measures the preset.

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
from comlrl_lab.engine.presets import MARLHF_QUICKSTART_CONFIG as PRESET  # noqa: E402
from comlrl_lab.engine.presets import MARLHF_QUICKSTART_TRAIN_ITEMS, QUICKSTART_EVAL_ITEMS  # noqa: E402
from comlrl_lab.engine.run import apply_torch_threads  # noqa: E402
from comlrl_lab.names.run_ids import new_run_id  # noqa: E402
from comlrl_lab.trainers.preference.runtime.sink import MemorySink  # noqa: E402
from comlrl_lab.ui.intervals import mean_interval  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="length_ratio", choices=list_tasks())
    parser.add_argument("--model", default="comlrl-lab/tiny")
    parser.add_argument("--algorithm", default=PRESET["rl_algorithm"], help="rl_algorithm")
    parser.add_argument("--rounds", type=int, default=PRESET["num_iterations"])
    parser.add_argument("--train-items", type=int, default=MARLHF_QUICKSTART_TRAIN_ITEMS)
    parser.add_argument("--eval-items", type=int, default=QUICKSTART_EVAL_ITEMS)
    parser.add_argument("--eval-samples-per-item", type=int, default=PRESET["eval_samples_per_item"])
    parser.add_argument("--candidates", type=int, default=PRESET["preference_num_candidates"])
    parser.add_argument("--pairs-per-item", type=int, default=PRESET["preference_pairs_per_sample"])
    parser.add_argument("--pair-selection", default=PRESET["pair_selection"])
    parser.add_argument("--generations", type=int, default=PRESET["num_generations"], help="num_generations")
    parser.add_argument("--max-new-tokens", type=int, default=PRESET["max_new_tokens"])
    parser.add_argument("--agent-lr", type=float, default=PRESET["agent_learning_rate"])
    parser.add_argument("--reward-lr", type=float, default=PRESET["reward_learning_rate"])
    parser.add_argument("--reward-epochs", type=int, default=PRESET["reward_num_train_epochs"])
    parser.add_argument("--rl-epochs", type=int, default=PRESET["num_train_epochs"])
    parser.add_argument("--replay-mode", default=PRESET["preference_replay_mode"])
    parser.add_argument(
        "--replay-sample-size",
        type=int,
        default=PRESET["preference_replay_sample_size"],
        help="preference_replay_sample_size",
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=PRESET["seed"], help="the first seed")
    parser.add_argument("--seeds", type=int, default=1, help="runs with seeds --seed, --seed + 1, ...")
    parser.add_argument("--output-dir", default=None, help="run directory (default: a temporary one)")
    return parser.parse_args(argv)


def last(records, name: str) -> float:
    values = [m["value"] for r in records for m in r.metrics if m["name"] == name]
    return values[-1] if values else math.nan


def run_curve(args: argparse.Namespace, seed: int) -> dict[str, list[float]]:
    """One run of the preset with the command line's changes; its per-round held-out BT accuracy and eval reward."""
    task = get_task(args.task)
    output_dir = args.output_dir or tempfile.mkdtemp(prefix="marlhf_curve_")
    config = {
        **PRESET,
        "rl_algorithm": args.algorithm,
        "num_iterations": args.rounds,
        "num_generations": args.generations,
        "preference_num_candidates": args.candidates,
        "preference_pairs_per_sample": args.pairs_per_item,
        "preference_replay_mode": args.replay_mode,
        "preference_replay_sample_size": args.replay_sample_size,
        "pair_selection": args.pair_selection,
        "max_new_tokens": args.max_new_tokens,
        "agent_learning_rate": args.agent_lr,
        "reward_learning_rate": args.reward_lr,
        "reward_num_train_epochs": args.reward_epochs,
        "num_train_epochs": args.rl_epochs,
        "eval_num_samples": args.eval_items,
        "eval_samples_per_item": args.eval_samples_per_item,
        "agent_devices": args.device,
        "seed": seed,
    }
    spec = ExperimentSpec(
        algorithm="MARLHFIter",
        agent_models=[args.model] * task.num_agents,
        task=args.task,
        config=config,
        max_train_items=args.train_items,
        max_eval_items=args.eval_items,
    )
    sink = MemorySink()
    started = time.monotonic()
    apply_torch_threads(spec)  # one thread for the embedded model, as a run of the engine has
    trainer = build_trainer(spec, output_dir=output_dir, run_id=new_run_id("marlhf-curve"), sink=sink)
    curve: dict[str, list[float]] = {"bt_val_accuracy": [math.nan], "eval_reward": []}
    curve["eval_reward"].append(trainer.evaluate()["eval/turn_1/reward_mean"])
    print(
        f"MARLHFIter on {args.task}, {args.algorithm}, seed {seed}, {args.train_items} train items, "
        f"{args.eval_items} eval items x {args.eval_samples_per_item}; run dir {output_dir}"
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
    curve["seconds"] = [time.monotonic() - started]
    return curve


def main(argv: list[str] | None = None) -> list[dict[str, list[float]]]:
    args = parse_args(argv)
    curves = [run_curve(args, args.seed + offset) for offset in range(args.seeds)]
    rounds = len(curves[0]["eval_reward"])
    per_round = [mean_interval([c["eval_reward"][r] for c in curves]) for r in range(rounds)]
    rise = mean_interval([c["eval_reward"][-1] - c["eval_reward"][0] for c in curves])
    accuracy = mean_interval([c["bt_val_accuracy"][-1] for c in curves])
    print(f"\n{args.seeds} seed(s), mean ± 95% CI (Student's t over seeds):")
    print("eval task reward by round: " + " | ".join(i.text() for i in per_round))
    print(
        f"rise (last round - round 0): {rise}  ({'learns' if rise.excludes_zero() and rise.mean > 0 else 'no clear rise'})"
    )
    print(f"BT held-out accuracy, last round: {accuracy.text()}")
    print(f"wall time per run: {mean_interval([c['seconds'][0] for c in curves]).text(1)} s")
    return curves


if __name__ == "__main__":
    main()
