"""benchmarks/cpu_gemm.py: its table from known timings, and one short measurement on this machine."""

from __future__ import annotations

import pytest
from repo_scripts import load_repo_script


def load_benchmark():
    return load_repo_script("benchmarks/cpu_gemm.py", "cpu_gemm_benchmark")


def test_the_table_gives_microseconds_and_gflops_per_kernel():
    bench = load_benchmark()
    # 2 * 100 * 100 * 100 = 2 MFLOP: 20 us is 100 GFLOP/s, 40 us 50, 2 ms 1.
    row = {"shape": (100, 100, 100), "flops": 2_000_000, "blas": 20e-6, "onednn": 10e-6, "onednn_new_shape": 2e-3}
    row |= {"numpy": 40e-6, "onednn_diff": 5.3e-5}
    without_onednn = {"shape": (1, 2, 3), "flops": 12, "blas": 1e-6, "numpy": 1e-6}
    assert bench.report([row, without_onednn], "BLAS").splitlines() == [
        "| (rows, in, out) | torch.mm (BLAS) | oneDNN, cached | oneDNN, new shape | NumPy | oneDNN - mm |",
        "|---|---|---|---|---|---|",
        "| (100, 100, 100) | 20 us (100 GFLOP/s) | 10 us (200 GFLOP/s) | 2000 us (1 GFLOP/s) | 40 us (50 GFLOP/s) "
        "| 5.3e-05 |",
        "| (1, 2, 3) | 1 us (0 GFLOP/s) | n/a | n/a | 1 us (0 GFLOP/s) | n/a |",
    ]


def test_the_shapes_are_the_tiny_models_products():
    from transformers import AutoConfig

    from comlrl_lab.models.tiny_model import tiny_model_path

    config = AutoConfig.from_pretrained(tiny_model_path())
    hidden, mlp, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    assert [shape[1:] for shape in load_benchmark().SHAPES["tiny"]] == [
        (hidden, hidden),
        (hidden, mlp),
        (mlp, hidden),
        (hidden, vocab),
    ]


def test_a_short_measurement_times_every_kernel_and_onednn_agrees_with_mm():
    bench = load_benchmark()
    rows = bench.measure(bench.SHAPES["tiny"], repeats=3)
    assert [row["shape"] for row in rows] == bench.SHAPES["tiny"]
    assert all(row["blas"] > 0 and row["numpy"] > 0 for row in rows)
    if bench.onednn_linear() is None:
        pytest.skip("this torch has no oneDNN linear")
    for row in rows:
        assert row["onednn"] > 0 and row["onednn_new_shape"] > 0
        # The same product in another summation order: equal up to float32 rounding of sums over 128-384 terms.
        assert row["onednn_diff"] < 1e-3


def test_mkl_kernels_names_the_branch_mkl_chose_or_none():
    from mkl_kernels import MKL_BRANCH_NAMES, mkl_branch

    branch = mkl_branch()
    assert branch is None or branch in MKL_BRANCH_NAMES.values() or branch.startswith("branch ")
