"""How fast this CPU runs the fp32 matrix products of a small MADPO update, through each kernel torch has.

Our side of ``vs_comlrl.py`` spends most of an update in matrix products, so its ratio to CoMLRL moves with how
fast torch's fp32 GEMM is on the machine. This times, one thread, the products of one packed scoring forward:
``--model tiny`` (the default) the embedded tiny model's at 2 rows of 37 tokens (the mean of ``vs_comlrl.py``'s
config 2; hidden 128, MLP 384, vocabulary 1,307), ``--model smollm2`` SmolLM2-135M's at 2 rows of 90 tokens
(hidden 576, key/value 192, MLP 1,536, vocabulary 49,152; random weights, nothing to download):

- ``mkl``: ``torch.mm``, what every ``nn.Linear`` on the CPU calls (the BLAS torch was built with, MKL in the
  PyPI wheels);
- ``onednn``: the oneDNN kernel inside the same torch (``torch.ops.mkldnn._linear_pointwise``, a private op that
  torch's compiler uses), once with its kernel cached for the shape and once with a new row count each call, as an
  update's varying sequence lengths would give it;
- ``numpy``: NumPy's BLAS (OpenBLAS in its wheels), for a third opinion.

It names the code path MKL chose on this CPU (``mkl_kernels.py``); it changes none of MKL's choices.

It prints microseconds per product and GFLOP/s. Usage::

    python benchmarks/cpu_gemm.py [--model tiny|smollm2] [--repeats 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from functools import partial

import numpy as np
import torch
from mkl_kernels import mkl_branch

#: (rows, in, out) of each model's products: attention, key/value (where narrower), the MLP's up and down, the head.
SHAPES = {
    "tiny": [(74, 128, 128), (74, 128, 384), (74, 384, 128), (74, 128, 1307)],
    "smollm2": [(180, 576, 576), (180, 576, 192), (180, 576, 1536), (180, 1536, 576), (180, 576, 49152)],
}


def per_call_seconds(call, repeats: int) -> float:
    """The median of five timings of ``repeats`` calls, per call, after a warm-up."""
    for _ in range(min(repeats, 50)):
        call()
    timings = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(repeats):
            call()
        timings.append((time.perf_counter() - started) / repeats)
    return statistics.median(timings)


def onednn_linear():
    """torch's oneDNN linear on dense tensors, or None where this torch has none."""
    try:
        op = torch.ops.mkldnn._linear_pointwise.default
    except (AttributeError, RuntimeError):
        return None
    return lambda x, weight: op(x, weight, None, "none", [], "")


def measure(shapes: list[tuple[int, int, int]], repeats: int) -> list[dict]:
    """One row per shape: microseconds per call of each kernel, and the largest difference from ``torch.mm``."""
    generator = torch.Generator().manual_seed(0)
    linear = onednn_linear()
    rows = []
    for m, k, n in shapes:
        x, weight = torch.randn(m, k, generator=generator), torch.randn(n, k, generator=generator)
        weight_t = weight.t().contiguous()
        row = {"shape": (m, k, n), "flops": 2 * m * k * n}
        row["blas"] = per_call_seconds(partial(torch.mm, x, weight_t), repeats)
        x_np, weight_np = x.numpy(), weight_t.numpy()
        row["numpy"] = per_call_seconds(partial(np.matmul, x_np, weight_np), repeats)
        if linear is not None:
            row["onednn"] = per_call_seconds(partial(linear, x, weight), repeats)
            row["onednn_diff"] = float((linear(x, weight) - torch.mm(x, weight_t)).abs().max())
            # A new row count each call: oneDNN builds a kernel per shape (its cache keeps them afterwards).
            fresh = [torch.randn(m + 1 + i, k, generator=generator) for i in range(max(3, min(50, repeats // 40)))]
            started = time.perf_counter()
            for y in fresh:
                linear(y, weight)
            row["onednn_new_shape"] = (time.perf_counter() - started) / len(fresh)
        rows.append(row)
    return rows


def report(rows: list[dict], blas_label: str) -> str:
    """A Markdown table of ``measure``'s rows."""
    lines = [
        f"| (rows, in, out) | torch.mm ({blas_label}) | oneDNN, cached | oneDNN, new shape | NumPy | oneDNN - mm |",
        "|---" * 6 + "|",
    ]

    def cell(row, name):
        if name not in row:
            return "n/a"
        return f"{row[name] * 1e6:.0f} us ({row['flops'] / row[name] / 1e9:.0f} GFLOP/s)"

    for row in rows:
        diff = f"{row['onednn_diff']:.1e}" if "onednn_diff" in row else "n/a"
        lines.append(
            f"| {row['shape']} | {cell(row, 'blas')}"
            f" | {cell(row, 'onednn')} | {cell(row, 'onednn_new_shape')} | {cell(row, 'numpy')} | {diff} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(SHAPES), default="tiny", help="whose products to time")
    parser.add_argument("--repeats", type=int, default=None, help="calls per timing (five timings, the median)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    repeats = args.repeats or {"tiny": 2000, "smollm2": 5}[args.model]
    kernels = torch.backends.cpu.get_cpu_capability()
    branch = mkl_branch()
    print(f"{args.model}: torch {torch.__version__}, {kernels} kernels, one thread, numpy {np.__version__}")
    print(f"MKL: {branch} kernels\n" if branch else "torch has no MKL\n")
    rows = measure(SHAPES[args.model], repeats)
    print(report(rows, f"MKL, {branch}" if branch else "BLAS"))


if __name__ == "__main__":
    main()
