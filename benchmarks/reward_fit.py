"""MARLHF's reward model: a Bradley-Terry fit and candidate scoring, with its last decoder layer run only where read.

A joint reward model reads one hidden state per joint text (its last token's), so its backbone's last layer runs at
those positions only (``comlrl_lab.models.read_positions``); ``--no-last-layer-at-read-positions`` runs it at every
position, as before. Both ways run here on the same pairs, one fresh reward model per run, alternating which goes
first; it prints each run's milliseconds per fitted pair and per scored text, and the on / off ratio of each pair of
runs.

The pairs are config 3's shape (``vs_comlrl.py``): the built-in ``length_ratio`` task's prompts for both agents,
each with a winner and a loser response of 2-12 words drawn from a seeded stream, packed as the trainer packs them
(``pack_pair_scoring``), one optimiser step per pair (CoMLRL's ``reward_train_batch_size=1``). Usage::

    python benchmarks/reward_fit.py [--pairs 96] [--repeats 3] [--threads 1] [--no-last-layer-at-read-positions]

With the switch off every run is an "off" run (no ratio): interleave such a command with a default one to compare
fresh processes.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from machine import machine_description, machine_line
from transformers import AutoModelForCausalLM, AutoTokenizer

from comlrl_lab.data.tasks import get_task
from comlrl_lab.models.tiny_model import tiny_model_path
from comlrl_lab.trainers.preference.learning.reward_model import JointRewardModel, fit_bradley_terry

WORDS = [
    "the",
    "a",
    "book",
    "friend",
    "is",
    "nice",
    "noisy",
    "safe",
    "poor",
    "terrible",
    "good",
    "small",
    "big",
    "and",
    "very",
    "quite",
]


def joint_pairs(count: int, seed: int = 0) -> tuple[list[list[str]], list[tuple[str, str]], list[list[str]]]:
    """``count`` (prompts, (winner text, loser text)) of the length_ratio task, and a third response set to score."""
    task = get_task("length_ratio")
    items = task.train_items()
    rng = random.Random(seed)

    def response() -> str:
        return " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 12))) + "."

    prompts, pairs, scored = [], [], []
    for index in range(count):
        item_prompts = task.prompts(items[index % len(items)])
        winner, loser = [response(), response()], [response(), response()]
        prompts.append(item_prompts)
        pairs.append(
            (JointRewardModel.joint_text(item_prompts, winner), JointRewardModel.joint_text(item_prompts, loser))
        )
        scored.append([response(), response()])
    return prompts, pairs, scored


def one_run(last_layer_at_read_positions: bool, prompts, pairs, scored) -> tuple[float, float]:
    """Milliseconds per fitted pair and per scored joint text, for a fresh reward model on the tiny model."""
    path = tiny_model_path()
    backbone = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    model = JointRewardModel.from_backbone(
        backbone,
        AutoTokenizer.from_pretrained(path),
        generator=torch.Generator().manual_seed(0),
        packed=True,
        last_layer_at_read_positions=last_layer_at_read_positions,
    )
    started = time.perf_counter()
    fit_bradley_terry(model, pairs, epochs=1, batch_size=1, learning_rate=1e-5, rng=random.Random(0))
    fit_ms = (time.perf_counter() - started) * 1000 / len(pairs)
    started = time.perf_counter()
    model.score_joint(prompts, scored, micro_batch_size=32)
    return fit_ms, (time.perf_counter() - started) * 1000 / len(scored)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=96, help="pairs fitted (one optimiser step each) per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per side, alternating")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument(
        "--no-last-layer-at-read-positions",
        dest="read_positions",
        action="store_false",
        help="run the backbone's last layer at every position (the saving off) in every run",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(machine_line(machine_description()))
    prompts, pairs, scored = joint_pairs(args.pairs)
    sides = (True, False) if args.read_positions else (False,)
    ratios = []
    for repeat in range(args.repeats):
        order = sides if repeat % 2 == 0 else sides[::-1]
        runs = {side: one_run(side, prompts, pairs, scored) for side in order}
        line = "; ".join(
            f"{'on' if side else 'off'}: fit {fit:.2f} ms/pair, score {score:.2f} ms/text"
            for side, (fit, score) in runs.items()
        )
        if len(runs) == 2:
            ratios.append((runs[True][0] / runs[False][0], runs[True][1] / runs[False][1]))
            line += f"; on / off: fit {ratios[-1][0]:.3f}, score {ratios[-1][1]:.3f}"
        print(f"run {repeat + 1}: {line}", flush=True)
    if ratios:
        print(
            f"median on / off over {len(ratios)} pairs of runs: fit {statistics.median(r[0] for r in ratios):.3f}, "
            f"score {statistics.median(r[1] for r in ratios):.3f}"
        )


if __name__ == "__main__":
    main()
