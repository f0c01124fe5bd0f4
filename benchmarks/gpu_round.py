"""The CUDA path checked for real: one MADPOIter round and one MARLHFIter round on a GPU in bf16.

Each algorithm runs its four phases (collect, select, train, evaluate) once on the built-in task with the model
given (default: the embedded tiny model; pass a hub id or directory for a real model), ``model_config``
``{"dtype": "bf16"}`` and every model on the CUDA devices ``agent_devices`` resolves to. Per phase it reports
seconds and generated tokens per second, and per algorithm ``torch.cuda.max_memory_allocated`` on each device.
It also checks what a CPU run cannot: the agents' parameters really are bf16 on CUDA, losses are finite, and the
weights moved. With ``--lora R`` the agents train LoRA adapters of rank R (peft).

Without a CUDA device it says so and exits with status 0 (nothing to check on this host); ``--require-cuda``
makes that status 2 and ``--cpu-smoke`` runs the same rounds on the CPU (to check the script; figures mean
nothing there). Usage::

    python benchmarks/gpu_round.py [--model comlrl-lab/tiny] [--task length_ratio] [--items 32]
        [--candidates 8] [--max-new-tokens 64] [--algorithms MADPOIter MARLHFIter] [--lora 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from comlrl_lab.data.tasks import get_task  # noqa: E402
from comlrl_lab.engine import ExperimentSpec, build_trainer  # noqa: E402
from comlrl_lab.models.tiny_model import TINY_MODEL_NAME  # noqa: E402
from comlrl_lab.names.run_ids import new_run_id  # noqa: E402
from comlrl_lab.trainers.preference.runtime.sink import MemorySink  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=TINY_MODEL_NAME, help="embedded name, directory or cached hub id")
    parser.add_argument("--task", default="length_ratio")
    parser.add_argument("--items", type=int, default=32)
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64, help="generation batch size")
    parser.add_argument("--algorithms", nargs="+", default=["MADPOIter", "MARLHFIter"])
    parser.add_argument("--lora", type=int, default=None, help="LoRA rank (None: train every weight)")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--require-cuda", action="store_true", help="exit 2 instead of 0 when there is no GPU")
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="run on the CPU to check this script (figures mean nothing)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    return parser.parse_args(argv)


def common_config(args) -> dict:
    return dict(
        num_iterations=1,
        num_train_epochs=1,
        preference_num_candidates=args.candidates,
        preference_pairs_per_sample=args.candidates,
        max_new_tokens=args.max_new_tokens,
        generation_batch_size=args.batch_size,
        train_batch_size=16,
        scoring_batch_size=16,
        eval_num_samples=16,
        temperature=1.0,
        top_p=1.0,
        agent_learning_rate=1e-4,
        lora_r=args.lora,
        gradient_checkpointing=args.gradient_checkpointing,
        seed=0,
    )


def build(algorithm: str, args, output_dir: str, sink: MemorySink):
    """The trainer the engine builds for this experiment: ``args.items`` train items, every eval item."""
    values = common_config(args)
    if args.cpu_smoke:
        values["agent_devices"] = "cpu"
    if algorithm == "MARLHFIter":
        values.update(num_generations=4, rollout_buffer_size=8, reward_train_batch_size=8, reward_num_train_epochs=1)
    spec = ExperimentSpec(
        algorithm=algorithm,
        agent_models=[args.model] * get_task(args.task).num_agents,
        task=args.task,
        config=values,
        model_config={"dtype": "fp32" if args.cpu_smoke else "bf16"},
        max_train_items=args.items,
    )
    return build_trainer(spec, output_dir=output_dir, run_id=new_run_id("gpu-round"), sink=sink)


def _sync(cuda: bool) -> None:
    if cuda:
        torch.cuda.synchronize()


def run_round(algorithm: str, args) -> dict:
    cuda = not args.cpu_smoke
    for index in range(torch.cuda.device_count() if cuda else 0):
        torch.cuda.reset_peak_memory_stats(index)
    sink = MemorySink()
    with tempfile.TemporaryDirectory(prefix="comlrl-gpu-round-") as output_dir:
        started = time.perf_counter()
        trainer = build(algorithm, args, output_dir, sink)
        load_seconds = time.perf_counter() - started
        devices = [str(d) for d in trainer.agent_devices]
        dtypes = sorted(
            {str(p.dtype) for m in trainer.agents for p in m.parameters() if not p.requires_grad or args.lora is None}
        )
        if cuda and any(torch.device(d).type != "cuda" for d in devices):
            raise RuntimeError(f"{algorithm}: agents resolved to {devices}, not CUDA devices")
        if cuda and "torch.bfloat16" not in dtypes:
            raise RuntimeError(f"{algorithm}: expected bf16 weights on CUDA, got {dtypes}")
        before = [next(p for p in m.parameters() if p.requires_grad).detach().float().clone() for m in trainer.agents]
        phases = {}
        while not trainer.finished:
            phase = trainer.next_phase
            _sync(cuda)
            start = time.perf_counter()
            records = trainer.step()
            _sync(cuda)
            seconds = time.perf_counter() - start
            tokens = sum(sum(c.token_counts) for c in records.candidates) if records.candidates else 0
            phases[phase] = {
                "seconds": round(seconds, 3),
                "generated_tokens": tokens,
                "tokens_per_s": round(tokens / seconds, 1) if tokens else None,
            }
        moved = any(
            not torch.equal(b, next(p for p in m.parameters() if p.requires_grad).detach().float())
            for b, m in zip(before, trainer.agents)
        )
        losses = [
            m["value"] for r in sink.phases for m in r.metrics if m["name"] in ("madpo/loss", "rl/loss", "bt/loss")
        ]
    return {
        "algorithm": algorithm,
        "devices": devices,
        "weight_dtypes": dtypes,
        "load_seconds": round(load_seconds, 2),
        "phases": phases,
        "pairs": len(sink.pairs()),
        "weights_moved": moved,
        "losses_finite": bool(losses) and all(math.isfinite(v) for v in losses),
        "peak_memory_gib": {
            f"cuda:{i}": round(torch.cuda.max_memory_allocated(i) / 2**30, 3)
            for i in range(torch.cuda.device_count() if cuda else 0)
        },
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("skipped: no CUDA device on this host; benchmarks/gpu_round.py checks the CUDA path only")
        return 2 if args.require_cuda else 0
    results = [run_round(algorithm, args) for algorithm in args.algorithms]
    where = (
        "CPU smoke test (fp32)" if args.cpu_smoke else f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    )
    if args.json:
        print(json.dumps({"device": where, "model": args.model, "results": results}))
    else:
        print(f"{where}, model {args.model}, lora={args.lora}")
        for result in results:
            print(
                f"  {result['algorithm']} on {result['devices']} ({', '.join(result['weight_dtypes'])}), "
                f"{result['pairs']} pairs, weights moved: {result['weights_moved']}, "
                f"losses finite: {result['losses_finite']}"
            )
            for phase, values in result["phases"].items():
                rate = f"{values['tokens_per_s']:.0f} tokens/s" if values["tokens_per_s"] else ""
                print(f"    {phase:<9} {values['seconds']:>8.2f} s  {rate}")
            print(f"    peak memory {result['peak_memory_gib']} GiB")
    failed = [r for r in results if not (r["weights_moved"] and r["losses_finite"])]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
