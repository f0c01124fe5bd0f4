"""Does MADPOIter learn? Evaluation-reward curves per built-in task and MADPO setting, as mean ± 95% CI over seeds.

For each built-in task and each setting (the seed's reference-free loss, each opt-in stabiliser alone, and all
of them combined) it runs MADPOIter on the embedded tiny model once per seed, evaluates before training (round
0) and after every round on the task's eval split (the same samples every round: common random numbers), and
prints the curve and the final rise (last round minus round 0) as mean ± 95% CI over the seeds (Student t).
``--model smollm2-135m-instruct`` runs the real-model preset instead (LoRA, chat template; its sizes become the
defaults), on the registered model.

    python benchmarks/learning.py                      # every task, every setting, 3 seeds (long: see --help)
    python benchmarks/learning.py --tasks length_ratio --settings seed,combined --seeds 3 --json out.json
    python benchmarks/learning.py --model smollm2-135m-instruct --settings combined --by stance

A rise "learns" when its CI excludes 0. It is a claim about these settings on these models, not about MADPO in
general.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace

from field_args import add_set_argument

from comlrl_lab.engine.presets import QUICKSTART_CONFIG, SMOLLM2_MODEL_NAME, quickstart_spec, smollm2_spec
from comlrl_lab.models.tiny_model import TINY_MODEL_NAME
from comlrl_lab.trainers.preference import MADPOIterConfig
from comlrl_lab.ui.intervals import Interval
from comlrl_lab.ui.intervals import mean_interval as mean_ci

_STABILISERS = ("madpo_reference", "madpo_length_normalize", "madpo_nll_weight")
#: Per agent model: the preset whose config and item counts a run starts from.
PRESETS = {TINY_MODEL_NAME: quickstart_spec, SMOLLM2_MODEL_NAME: smollm2_spec}
#: Opt-in MADPO stabilisers per setting name; "seed" is CoMLRL's loss, "combined" the quickstart preset's.
SETTINGS: dict[str, dict[str, object]] = {
    "seed": {},
    "reference": {"madpo_reference": QUICKSTART_CONFIG["madpo_reference"]},
    "length_norm": {"madpo_length_normalize": QUICKSTART_CONFIG["madpo_length_normalize"]},
    "nll": {"madpo_nll_weight": QUICKSTART_CONFIG["madpo_nll_weight"]},
    "combined": {name: QUICKSTART_CONFIG[name] for name in _STABILISERS},
}


def group_means(candidates: Sequence, items: Sequence[dict], field: str) -> dict[str, float]:
    """Mean evaluation reward per value of the eval items' ``field``, over the samples the logged mean counts
    (``mean_reward``: parsed, not NaN); items without the field, and values with no such sample, are left out."""
    from comlrl_lab.trainers.preference.rounds.collection import mean_reward

    groups: dict[str, list] = {}
    for candidate in candidates:
        item = items[candidate.item_index]
        if field in item:
            groups.setdefault(str(item[field]), []).append(candidate)
    means = {value: mean_reward(group) for value, group in sorted(groups.items())}
    return {value: mean for value, mean in means.items() if not math.isnan(mean)}


def run_curve(
    task_name: str, setting: str, seed: int, args: argparse.Namespace
) -> tuple[list[float], list[float], list[dict[str, float]]]:
    """Evaluation reward before training and after each round of one MADPOIter run, its standard errors, and
    (with ``--by FIELD``) the mean reward per value of the eval items' FIELD at round 0 and the last round."""
    import torch

    from comlrl_lab.data.tasks import get_task
    from comlrl_lab.engine import build_trainer
    from comlrl_lab.names import metric_names
    from comlrl_lab.names.run_ids import new_run_id

    torch.set_num_threads(1)
    eval_items = get_task(task_name).eval_items()[: args.eval_items]
    values = {name: value for name, value in PRESETS[args.model]().config.items() if name not in _STABILISERS}
    values.update(
        num_iterations=max(args.rounds, 1),  # --rounds 0: the untrained model's evaluation alone
        preference_num_candidates=args.candidates,
        num_train_epochs=args.epochs,
        agent_learning_rate=args.lr,
        dpo_beta=args.beta,
        max_new_tokens=args.max_new_tokens,
        eval_num_samples=len(eval_items),
        eval_samples_per_item=args.eval_samples_per_item,
        seed=seed,
        **SETTINGS[setting],
    )
    values.update(args.fields)
    # The model's preset's spec (task, agents), sized by the arguments; the engine builds its trainer.
    spec = replace(
        PRESETS[args.model](task_name), config=values, max_train_items=args.items, max_eval_items=args.eval_items
    )
    trainer = build_trainer(
        spec, output_dir=tempfile.mkdtemp(prefix="learning-"), run_id=new_run_id(f"{task_name}-{setting}-{seed}")
    )
    first = trainer.evaluate()
    curve, sems = [first[metric_names.EVAL_REWARD_MEAN]], [first[metric_names.EVAL_REWARD_SEM]]
    groups = [group_means(trainer.last_eval_candidates, eval_items, args.by)] if args.by else []
    while args.rounds and not trainer.finished:
        records = trainer.step()
        if records.phase == "evaluate":
            logged = {m["name"]: m["value"] for m in records.metrics}
            curve.append(logged[metric_names.EVAL_REWARD_MEAN])
            sems.append(logged[metric_names.EVAL_REWARD_SEM])
    if args.by:
        groups.append(group_means(trainer.last_eval_candidates, eval_items, args.by))
    return curve, sems, groups


def summarise(curves: Sequence[Sequence[float]]) -> tuple[list[Interval], Interval]:
    """Per-round mean ± CI over seeds, and the final rise (last round minus round 0) with its CI."""
    per_round = [mean_ci([c[r] for c in curves]) for r in range(len(curves[0]))]
    rise = mean_ci([c[-1] - c[0] for c in curves])
    return per_round, rise


def group_lines(field: str | None, runs: Sequence[Sequence[dict[str, float]]]) -> list[str]:
    """One line per value of ``field``: its reward at round 0 and the last round, and its rise, over the seeds."""
    if not field or not runs or not runs[0]:
        return []
    lines = []
    for value in runs[0][0]:
        first = mean_ci([groups[0][value] for groups in runs])
        last = mean_ci([groups[-1][value] for groups in runs])
        rise = mean_ci([groups[-1][value] - groups[0][value] for groups in runs])
        lines.append(f"    {field}={value}: round 0 {first}, last {last}, rise {rise}")
    return lines


def main(argv: list[str] | None = None) -> int:
    models = argparse.ArgumentParser(add_help=False)
    models.add_argument(
        "--model",
        default=TINY_MODEL_NAME,
        choices=list(PRESETS),
        help="the agents' model; its preset's sizes are the defaults below (default: the embedded tiny model)",
    )
    spec = PRESETS[models.parse_known_args(argv)[0].model]()
    preset = spec.config
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], parents=[models])
    parser.add_argument("--tasks", default="length_ratio,topic_relay,stance_agreement")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--seeds", type=int, default=3)
    # The defaults are the model's preset's sizes, so the "combined" row measures the preset itself.
    parser.add_argument("--rounds", type=int, default=preset["num_iterations"])
    parser.add_argument("--items", type=int, default=spec.max_train_items)
    parser.add_argument("--eval-items", type=int, default=preset["eval_num_samples"])
    parser.add_argument("--eval-samples-per-item", type=int, default=preset.get("eval_samples_per_item", 1))
    parser.add_argument("--candidates", type=int, default=preset["preference_num_candidates"])
    parser.add_argument("--max-new-tokens", type=int, default=preset["max_new_tokens"])
    parser.add_argument("--epochs", type=int, default=preset["num_train_epochs"])
    parser.add_argument("--lr", type=float, default=preset["agent_learning_rate"])
    parser.add_argument("--beta", type=float, default=preset["dpo_beta"])
    add_set_argument(
        parser,
        MADPOIterConfig,
        "any other MADPOIterConfig field for every run, e.g. pair_selection=reward_gap; repeatable",
    )
    parser.add_argument(
        "--by",
        default=None,
        metavar="FIELD",
        help="also split the evaluation reward by this eval-item field (e.g. stance): round 0, last round and rise per value",
    )
    parser.add_argument("--json", default=None, help="also write every curve to this file")
    args = parser.parse_args(argv)
    unknown = [s for s in args.settings.split(",") if s not in SETTINGS]
    if unknown:
        parser.error(f"unknown setting(s) {unknown}; choose from {', '.join(SETTINGS)}")

    print(
        f"MADPOIter, {args.model}, {args.rounds} rounds, {args.items} items, {args.candidates} candidates, "
        f"{args.max_new_tokens} tokens, {args.epochs} epochs, lr {args.lr}, beta {args.beta}, "
        f"{args.eval_items} eval items × {args.eval_samples_per_item} samples, {args.seeds} seeds"
        + "".join(f", {name}={value}" for name, value in args.fields)
        + "; mean ± 95% CI over seeds; eval SE: the largest logged standard error over seeds at round 0 and the last"
    )
    results, errors, by_group = {}, {}, {}
    for task in args.tasks.split(","):
        for setting in args.settings.split(","):
            started = time.perf_counter()
            runs = []
            for seed in range(args.seeds):
                runs.append(run_curve(task, setting, seed, args))
                # A long run (a real model) leaves each seed's curve behind as soon as it is known.
                print(f"  {task} {setting} seed {seed}: {' '.join(f'{v:.3f}' for v in runs[-1][0])}", flush=True)
            curves = [curve for curve, _, _ in runs]
            per_round, rise = summarise(curves)
            first_se, last_se = (max(sems[r] for _, sems, _ in runs) for r in (0, -1))
            results[f"{task}/{setting}"] = curves
            errors[f"{task}/{setting}"] = [sems for _, sems, _ in runs]
            verdict = "learns" if rise.excludes_zero() and rise.mean > 0 else "no clear rise"
            print(
                f"{task:<17} {setting:<12} eval by round: {' | '.join(str(r) for r in per_round)}  "
                f"rise {rise}  ({verdict}; eval SE {first_se:.3f} / {last_se:.3f}; "
                f"{(time.perf_counter() - started) / args.seeds:.0f} s/run)",
                flush=True,
            )
            for line in group_lines(args.by, [groups for _, _, groups in runs]):
                print(line, flush=True)
            if args.by:
                by_group[f"{task}/{setting}"] = [groups for _, _, groups in runs]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"args": vars(args), "curves": results, "sems": errors, "by": by_group}, handle, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
