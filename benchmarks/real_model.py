"""Speed and memory on a real model (SmolLM2-135M-Instruct by default): our sampler, a MADPO step, peak RSS, bf16.

Every figure is a ratio of two things measured in this run, on the same model, prompts and tokens, one torch thread
(``--threads``), interleaved over ``--repeats``:

- collection: tokens/s of the row-seeded sampler (what the trainers use) against raw batched ``model.generate``
  on the same chat-rendered task prompts (``collection.py``'s two sides); target >= 0.9;
- a train step: ``DPOLearner.update`` on a round's pairs against a raw padded forward + log-softmax gather +
  backward + fused AdamW step over the same tokens (``madpo_round.py``'s raw side plus the optimiser); target
  <= 1.1 (ours' seconds over raw's);
- memory, each in a fresh process: the peak RSS of two agents collecting and taking updates, above the process's
  RSS before the model loads, against weights + gradients + AdamW state (16 bytes a parameter in float32) for full
  fine-tuning (target <= 1.3), and LoRA's peak for comparison; once per scoring micro-batch size in
  ``--memory-scoring-batch-sizes``, because the activations the backward keeps grow with the pairs scored at once
  (both agents' forwards are alive until the one backward of the joint loss);
- bf16: the same collection and train step with the agents in bfloat16, against float32.

    python benchmarks/real_model.py                     # all of it (needs comlrl-lab models add smollm2-135m-instruct)
    python benchmarks/real_model.py --parts collection,step --repeats 3
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from collection import ours_row_seeded, raw_generate
from machine import load_line, machine_description, machine_line
from madpo_round import raw_batches

from comlrl_lab.models.registry import SMOLLM2_135M_INSTRUCT, registered_path

PARTS = ("collection", "step", "memory", "bf16")
#: float32 weights + gradients + AdamW's two moments.
FULL_FINE_TUNING_BYTES_PER_PARAMETER = 16


def rss_bytes() -> int:
    """This process's resident set size now (Linux)."""
    with open("/proc/self/statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize()


def scoring_batch_size(args) -> int:
    """Pairs per scoring forward: ``--scoring-batch-size``, else the whole update's batch."""
    return args.scoring_batch_size or args.batch_size


def build_trainer(args, output_dir: str, *, dtype: str = "float32", lora: bool = False, items: int | None = None):
    """One MADPOIter round's trainer on the registered model, built by the engine from a spec as a run's is."""
    from comlrl_lab.data.tasks import get_task
    from comlrl_lab.engine import ExperimentSpec
    from comlrl_lab.engine import build_trainer as engine_build_trainer
    from comlrl_lab.names.run_ids import new_run_id

    config = {
        "num_iterations": 1,
        "preference_num_candidates": args.candidates,
        "preference_pairs_per_sample": args.candidates,
        "max_new_tokens": args.max_new_tokens,
        "train_batch_size": args.batch_size,
        "scoring_batch_size": scoring_batch_size(args),
        "temperature": 0.7,
        "top_p": 0.9,
        "lora_r": 8 if lora else None,
        "lora_target_modules": "all-linear" if lora else None,
        "agent_devices": "cpu",
        "seed": 0,
    }
    spec = ExperimentSpec(
        algorithm="MADPOIter",
        agent_models=[args.model] * get_task(args.task).num_agents,
        task=args.task,
        config=config,
        model_config={"dtype": dtype},
        max_train_items=items or args.items,
        max_eval_items=1,  # the parts measured here never evaluate
    )
    return engine_build_trainer(spec, output_dir=output_dir, run_id=new_run_id("real-model"))


def collection(args, dtype: str = "float32") -> tuple[float, float]:
    """Raw and ours tokens/s (medians) on agent 1's chat-rendered prompts."""
    from comlrl_lab.models.generation import SamplingSettings

    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(args, tmp, dtype=dtype)
        model, tokenizer = trainer.agents[0], trainer.tokenizers[0]
        prompts = [trainer.formatters[0](item) for item in trainer.train_items]
        settings = SamplingSettings(max_new_tokens=args.max_new_tokens, temperature=0.7, top_p=0.9, batch_size=64)
        raw, ours = [], []
        for repeat in range(args.repeats):
            tokens, seconds = raw_generate(model, tokenizer, prompts, args.candidates, settings, repeat)
            raw.append(tokens / seconds)
            tokens, seconds = ours_row_seeded(model, tokenizer, prompts, args.candidates, settings, repeat)
            ours.append(tokens / seconds)
    return statistics.median(raw), statistics.median(ours)


def raw_step(models, optimizers, batch_tensors) -> None:
    """One padded forward + log-prob gather + backward + optimiser step per agent: the floor of an update."""
    for model, optimizer, (ids, attention, target) in zip(models, optimizers, batch_tensors):
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()  # (B, T-1, V)
        logps = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        (logps * target[:, 1:]).sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def train_step(args, dtype: str = "float32") -> tuple[float, float, int]:
    """Seconds per update of ours and raw (medians) on one round's pairs, and the pair count."""
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(args, tmp, dtype=dtype, lora=args.lora)
        trainer.step("collect")
        pairs = trainer.collector.round_pairs
        if not pairs:
            raise SystemExit("the round produced no pairs; raise --candidates")
        batches = [pairs[i : i + args.batch_size] for i in range(0, len(pairs), args.batch_size)]
        tensors = raw_batches(trainer, batches)
        for model in trainer.agents:
            model.train(trainer.context.train_mode_for_updates)
        ours, raw = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            for batch in batches:
                trainer.learner.update(batch)
            ours.append((time.perf_counter() - started) / len(batches))
            started = time.perf_counter()
            for batch in tensors:
                raw_step(trainer.agents, trainer.optimizers, batch)
            raw.append((time.perf_counter() - started) / len(batches))
    return statistics.median(ours), statistics.median(raw), len(pairs)


def memory_child(args) -> dict:
    """In a fresh process: RSS before loading, peak RSS after a collection and two passes of updates."""
    # The libraries' own memory is not the model's: import them before the first reading.
    import transformers  # noqa: F401

    import comlrl_lab.trainers.preference.madpo  # noqa: F401

    before = rss_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_trainer(args, tmp, lora=args.lora, items=4)
        parameters = sum(p.numel() for p in trainer.agents[0].parameters())
        trainable = sum(p.numel() for p in trainer.agents[0].parameters() if p.requires_grad)
        trainer.step("collect")
        pairs = trainer.collector.round_pairs[: args.batch_size]
        for model in trainer.agents:
            model.train(trainer.context.train_mode_for_updates)
        for _ in range(2):  # the second pass holds AdamW's moments from the first
            trainer.learner.update(pairs)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "before": before,
        "peak": peak,
        "parameters": parameters,
        "trainable": trainable,
        "agents": trainer.num_agents,
        "pairs": len(pairs),
    }


def memory(args, lora: bool) -> dict:
    command = [sys.executable, __file__, "--memory-child", "--model", args.model, "--threads", str(args.threads)]
    command += ["--batch-size", str(args.batch_size), "--max-new-tokens", str(args.max_new_tokens)]
    command += ["--candidates", str(args.candidates)] + (["--lora"] if lora else [])
    if args.scoring_batch_size:
        command += ["--scoring-batch-size", str(args.scoring_batch_size)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=Path(__file__).parent)
    return json.loads(done.stdout.strip().splitlines()[-1])


def gib(count: float) -> str:
    return f"{count / 2**30:.2f} GiB"


def figure(line: str, **print_options) -> None:
    """Print one figure with the load average at the time it was taken."""
    print(f"{line}  [{load_line()}]", **print_options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=SMOLLM2_135M_INSTRUCT.name)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"which of {', '.join(PARTS)}")
    parser.add_argument("--task", default="length_ratio")
    parser.add_argument("--items", type=int, default=8)
    parser.add_argument("--candidates", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument(
        "--scoring-batch-size",
        type=int,
        default=None,
        help="pairs per scoring micro-batch (scoring_batch_size) in the step and bf16 parts, and the memory part's "
        "default (default: --batch-size)",
    )
    parser.add_argument(
        "--memory-scoring-batch-sizes",
        default=None,
        help="comma-separated scoring micro-batch sizes the memory part measures, each in its own processes "
        "(default: --scoring-batch-size)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lora", action="store_true", help="the train step with LoRA r=8 adapters (memory: both)")
    parser.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.model == SMOLLM2_135M_INSTRUCT.name and registered_path(args.model) is None:
        print(f"skipped: {args.model} is not registered (comlrl-lab models add {args.model})")
        return 0
    if args.memory_child:
        print(json.dumps(memory_child(args)))
        return 0
    parts = args.parts.split(",")
    print(machine_line(machine_description()))
    print(
        f"model {args.model}, task {args.task}, {args.items} items x {args.candidates} candidates, "
        f"{args.max_new_tokens} tokens, batch {args.batch_size} (scoring micro-batch "
        f"{scoring_batch_size(args)}), {args.threads} thread(s), {args.repeats} repeats"
    )
    if "collection" in parts:
        raw, ours = collection(args)
        figure(
            f"collection: raw generate {raw:.1f} tok/s, ours {ours:.1f} tok/s: ratio {ours / raw:.2f} (target >= 0.9)"
        )
    if "step" in parts:
        ours, raw, pairs = train_step(args)
        kind = "LoRA r=8" if args.lora else "full"
        figure(
            f"train step ({kind}, {pairs} pairs, batch {args.batch_size}): DPOLearner.update {ours:.2f} s, "
            f"raw fwd+bwd+AdamW {raw:.2f} s: ratio {ours / raw:.2f} (target <= 1.1)"
        )
    if "memory" in parts:
        sizes = args.memory_scoring_batch_sizes or str(scoring_batch_size(args))
        for size in (int(text) for text in sizes.split(",")):
            sized = argparse.Namespace(**{**vars(args), "scoring_batch_size": size})
            full, lora = memory(sized, lora=False), memory(sized, lora=True)
            state = full["agents"] * full["parameters"] * FULL_FINE_TUNING_BYTES_PER_PARAMETER
            used = full["peak"] - full["before"]
            figure(
                f"memory, scoring micro-batch {size} pairs, full fine-tuning of {full['agents']} agents x "
                f"{full['parameters'] / 1e6:.1f}M: peak RSS {gib(full['peak'])} ({gib(used)} above the "
                f"{gib(full['before'])} before loading) against weights + grads + AdamW {gib(state)}: ratio "
                f"{used / state:.2f} (target <= 1.3; whole process {full['peak'] / state:.2f})"
            )
            figure(
                f"memory, scoring micro-batch {size} pairs, LoRA r=8 ({lora['trainable'] / 1e6:.2f}M trainable per "
                f"agent): peak RSS {gib(lora['peak'])} ({gib(lora['peak'] - lora['before'])} above the start), "
                f"{lora['peak'] / full['peak']:.2f} of full's",
                flush=True,
            )
    if "bf16" in parts:
        raw32, ours32 = collection(args)
        raw16, ours16 = collection(args, dtype="bfloat16")
        step32, _, _ = train_step(args)
        step16, _, _ = train_step(args, dtype="bfloat16")
        figure(
            f"bf16 against fp32: collection {ours16:.1f} vs {ours32:.1f} tok/s ({ours16 / ours32:.2f}x; raw generate "
            f"{raw16 / raw32:.2f}x), train step {step16:.2f} vs {step32:.2f} s ({step32 / step16:.2f}x the speed)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
