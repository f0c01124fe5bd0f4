"""MADPO training speed: pairs scored per second against a raw batched forward+backward of the same tokens.

Both sides of the ratio run in this process on the same model and pairs:
- ``ours``: ``DPOLearner.update`` over the round's training pairs (batched scoring, joint margin,
  one backward, optimiser steps);
- ``raw``: for the same batches, one padded forward + log-softmax gather + backward per agent over winners and
  losers, with the tensors built before timing: the floor any implementation pays.

Then a whole round (collect, select, train, evaluate) is timed. Run: ``python benchmarks/madpo_round.py``.

Each exact-maths saving can be switched off to measure it (interleave on and off runs; the machine's load moves
the absolute rates, the ``ours / raw`` ratio much less): ``--adamw-implementation for_loop`` (per-tensor AdamW),
``--no-pack-pair-scoring`` (prompt scored twice per pair), ``--per-update-mode-switch`` (train/eval around every
update), ``--no-top-k-first`` and ``--no-prefill-once`` (sampler; they act with ``--top-p`` < 1 and in collect),
``--no-sides-in-one-pass`` (collect samples the current and comparator sides in two passes). With
``--checkpoint`` the round also writes its checkpoints (into the temporary folder), so that ``--save-strategy``
(phase: after every phase, round: once, no) and ``--save-in-background`` show what a checkpoint costs a round.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from sampler_switches import add_sampler_switches, sampler_savings_off

from comlrl_lab.data.tasks import get_task
from comlrl_lab.engine import ExperimentSpec, build_trainer
from comlrl_lab.models.tiny_model import TINY_MODEL_NAME
from comlrl_lab.names.run_ids import new_run_id


def build(args, output_dir: str):
    """The MADPOIter trainer the engine builds for this run, with the savings ``args`` switches off undone."""
    spec = ExperimentSpec(
        algorithm="MADPOIter",
        agent_models=[TINY_MODEL_NAME] * get_task(args.task).num_agents,
        task=args.task,
        config=dict(
            num_iterations=2,
            preference_num_candidates=args.candidates,
            preference_pairs_per_sample=args.candidates,
            max_new_tokens=args.max_new_tokens,
            train_batch_size=args.batch_size,
            scoring_batch_size=args.batch_size,
            eval_num_samples=16,
            temperature=args.temperature,
            top_p=args.top_p,
            agent_devices="cpu",
            seed=0,
            adamw_implementation=args.adamw_implementation,
            pack_pair_scoring=args.pack_pair_scoring,
            save_strategy=args.save_strategy,
            save_in_background=args.save_in_background,
        ),
        max_train_items=args.items,
    )
    trainer = build_trainer(spec, output_dir=output_dir, run_id=new_run_id("madpo-round"))
    if args.checkpoint:
        trainer.checkpoint_dir = Path(output_dir) / "checkpoint"
    if args.per_update_mode_switch:
        # The saving off: what the learner did before, a train()/eval() walk of every agent around each update.
        plain_update = trainer.learner._update

        def switching_update(batch, step):
            for model in trainer.agents:
                model.train(trainer.context.train_mode_for_updates)
            try:
                return plain_update(batch, step)
            finally:
                for model in trainer.agents:
                    model.eval()

        trainer.learner._update = switching_update
    switched_off = sampler_savings_off(args)
    if switched_off:
        plain = trainer.context.sampling_settings
        trainer.context.sampling_settings = lambda **overrides: plain(**{**switched_off, **overrides})
        # The comparator took its settings at construction: both sides sample alike.
        trainer.collector.comparator.context.sampling = trainer.context.sampling_settings()
    return trainer


def raw_batches(trainer, batches):
    """Right-padded (input_ids, attention_mask, target mask) per batch and agent, built before timing."""
    built = []
    for batch in batches:
        per_agent = []
        for i in range(trainer.num_agents):
            rows, masks = [], []
            for pair in batch:
                for completion in (pair.winner_ids[i], pair.loser_ids[i]):
                    rows.append(pair.prompt_ids[i] + completion)
                    masks.append([0] * len(pair.prompt_ids[i]) + [1] * len(completion))
            width = max(len(r) for r in rows)
            pad = trainer.context.pad_token_id(i)
            ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
            attention = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
            target = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.bool)
            per_agent.append((ids, attention, target))
        built.append(per_agent)
    return built


def raw_step(models, batch_tensors) -> None:
    for model, (ids, attention, target) in zip(models, batch_tensors):
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()  # (B, T-1, V)
        logps = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        (logps * target[:, 1:]).sum().backward()
        model.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="length_ratio")
    parser.add_argument("--items", type=int, default=32)
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0, help="CoMLRL's default is 0.6 (top-p sorts then run)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--adamw-implementation",
        default="fused",
        choices=("fused", "foreach", "for_loop"),
        help="the agents' AdamW (for_loop: the per-tensor loop, the saving off)",
    )
    add_sampler_switches(parser)
    parser.add_argument(
        "--no-pack-pair-scoring",
        dest="pack_pair_scoring",
        action="store_false",
        help="score winner and loser as two rows, the prompt twice (the saving off)",
    )
    parser.add_argument("--checkpoint", action="store_true", help="write the round's checkpoints (timed with it)")
    parser.add_argument(
        "--save-strategy",
        default="phase",
        choices=("phase", "round", "no"),
        help="with --checkpoint: after every phase, once per round, or never",
    )
    parser.add_argument(
        "--save-in-background",
        action="store_true",
        help="with --checkpoint: write each checkpoint in a background thread",
    )
    parser.add_argument(
        "--per-update-mode-switch",
        action="store_true",
        help="switch the agents' train/eval mode around every update, as before (the saving off)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        trainer = build(args, tmp)
        round_started = time.perf_counter()
        phase_seconds = {}
        for phase in ("collect", "select", "train", "evaluate"):
            started = time.perf_counter()
            trainer.step()
            phase_seconds[phase] = time.perf_counter() - started
        trainer.wait_for_checkpoint()  # a background write still counts against the round
        round_seconds = time.perf_counter() - round_started

        pairs = [trainer.context.ensure_token_ids(p) for p in trainer.collector.replay.round_pairs(1)]
        if not pairs:
            raise SystemExit("the round produced no pairs; raise --candidates")
        batches = [pairs[i : i + args.batch_size] for i in range(0, len(pairs), args.batch_size)]
        tensors = raw_batches(trainer, batches)
        tokens = sum(len(p.winner_ids[i]) + len(p.loser_ids[i]) for p in pairs for i in range(trainer.num_agents))

        ours, raw = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            for batch in batches:
                trainer.learner.update(batch)
            ours.append(len(pairs) / (time.perf_counter() - started))
            started = time.perf_counter()
            for batch in tensors:
                raw_step(trainer.agents, batch)
            raw.append(len(pairs) / (time.perf_counter() - started))

    ours_rate, raw_rate = statistics.median(ours), statistics.median(raw)
    print(
        f"model: {TINY_MODEL_NAME}, task: {args.task}, items: {args.items}, candidates: {args.candidates}, "
        f"max_new_tokens: {args.max_new_tokens}, threads: {args.threads}, adamw: {args.adamw_implementation}, "
        f"top_k_first: {args.top_k_first}, per-update mode switch: {args.per_update_mode_switch}, "
        f"prefill_once: {args.prefill_once}, pack_pair_scoring: {args.pack_pair_scoring}, "
        f"sides_in_one_pass: {args.sides_in_one_pass}, checkpoint: {args.checkpoint} "
        f"(save_strategy {args.save_strategy}, in background {args.save_in_background})"
    )
    print(f"pairs: {len(pairs)}, completion tokens per pass: {tokens}, batch: {args.batch_size}")
    print(f"DPOLearner.update    {ours_rate:8.1f} pairs/s")
    print(f"raw fwd+bwd        {raw_rate:8.1f} pairs/s")
    print(f"ratio (target >= 0.7): {ours_rate / raw_rate:.2f}")
    print(f"one round: {round_seconds:.2f} s  " + "  ".join(f"{k} {v:.2f}s" for k, v in phase_seconds.items()))


if __name__ == "__main__":
    main()
