"""comlrl_lab.mkl_dispatch: when MKL gets its AVX-512 kernels on an AMD CPU, and what a process then computes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from comlrl_lab import mkl_dispatch
from comlrl_lab.mkl_dispatch import MklDispatch, cpu_has_avx512_amd, decide

AMD_AVX512 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 26
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl
bugs\t\t: sysret_ss_attrs

processor\t: 1
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse2
"""
AMD_AVX2 = AMD_AVX512.replace(" avx512f avx512dq avx512bw avx512vl", "")
INTEL_AVX512 = AMD_AVX512.replace("AuthenticAMD", "GenuineIntel")


def test_only_an_amd_cpu_with_avx512f_in_its_first_flags_line_qualifies():
    assert cpu_has_avx512_amd(AMD_AVX512)
    assert not cpu_has_avx512_amd(AMD_AVX2)
    assert not cpu_has_avx512_amd(INTEL_AVX512)  # MKL already uses AVX-512 there
    assert not cpu_has_avx512_amd(AMD_AVX512.replace("avx512f ", "avx512fx "))  # a whole flag, not a prefix
    assert not cpu_has_avx512_amd("")


ACTIVE = MklDispatch(True, "loaded before torch: MKL chooses its kernels by this AMD CPU's instruction sets (AVX-512)")
OFF = MklDispatch(False, "turned off by COMLRL_LAB_MKL_AVX512")
NOT_AMD_AVX512 = MklDispatch(
    False, "not an AMD CPU with AVX-512: left to MKL (Intel's CPUs already get its best kernels)"
)
TORCH_FIRST = MklDispatch(False, "torch was imported before comlrl_lab: MKL keeps its generic kernels")


@pytest.mark.parametrize(
    ("environ", "torch_imported", "cpuinfo", "library", "expected"),
    [
        ({}, False, AMD_AVX512, "/lib.so", ACTIVE),
        ({"COMLRL_LAB_MKL_AVX512": "1"}, False, AMD_AVX512, "/lib.so", ACTIVE),
        ({"COMLRL_LAB_MKL_AVX512": " Off "}, False, AMD_AVX512, "/lib.so", OFF),
        ({"COMLRL_LAB_MKL_AVX512": "0"}, True, None, None, OFF),
        ({}, False, None, "/lib.so", MklDispatch(False, "not Linux (no /proc/cpuinfo): MKL keeps its own choice of kernels")),
        ({}, False, INTEL_AVX512, "/lib.so", NOT_AMD_AVX512),
        ({}, False, AMD_AVX2, "/lib.so", NOT_AMD_AVX512),
        ({}, False, AMD_AVX512, None, MklDispatch(False, "comlrl_lab._mkl_dispatch was not built (no C compiler or Python headers at install): MKL keeps its generic kernels")),
        ({}, True, AMD_AVX512, "/lib.so", TORCH_FIRST),
    ],
)  # fmt: skip
def test_decide_loads_the_library_only_when_every_condition_holds_and_says_why_not(
    environ, torch_imported, cpuinfo, library, expected
):
    assert decide(environ, torch_imported, cpuinfo, library) == expected


def read_cpuinfo() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def test_the_suite_imports_comlrl_lab_before_torch_so_its_subprocesses_share_its_kernels():
    # conftest.py imports comlrl_lab first, as the CLI and the app do: this process decided as one that had not loaded
    # torch, so it and the subprocesses it starts (the CLI, a resumed run) multiply with the same kernels.
    expected = decide(os.environ, False, read_cpuinfo(), mkl_dispatch.library_path())
    assert mkl_dispatch.status() == expected
    assert mkl_dispatch.status() != TORCH_FIRST


PROBE = """
import json, sys
first = sys.argv[1]
if first == "torch":
    import torch
import comlrl_lab
import torch
from comlrl_lab import mkl_dispatch
torch.set_num_threads(1)
generator = torch.Generator().manual_seed(0)
x = torch.randn(168, 128, generator=generator)  # one update's packed rows of the tiny model, by its MLP's width
w = torch.randn(384, 128, generator=generator)
product = torch.nn.functional.linear(x, w)
exact = x.double() @ w.double().t()
print(json.dumps({
    "active": mkl_dispatch.status().active,
    "reason": mkl_dispatch.status().reason,
    "branch": mkl_dispatch.mkl_branch(),
    "error": float(((product.double() - exact).abs() / exact.abs().clamp_min(1.0)).max()),
}))
"""


def probe(first: str, **env: str) -> dict:
    environment = {**os.environ, **env}
    if "COMLRL_LAB_MKL_AVX512" not in env:
        environment.pop("COMLRL_LAB_MKL_AVX512", None)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, first], env=environment, capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def this_machine_qualifies() -> bool:
    import torch

    cpuinfo = read_cpuinfo()
    qualifies = cpuinfo is not None and decide({}, False, cpuinfo, mkl_dispatch.library_path()).active
    return qualifies and torch.backends.mkl.is_available()


def test_a_process_that_imports_comlrl_lab_first_gets_mkls_avx512_kernels_and_the_same_products():
    if not this_machine_qualifies():
        pytest.skip("not an AMD CPU with AVX-512, the built extension and a torch with MKL: nothing to compare")
    loaded = probe("comlrl_lab")
    off = probe("comlrl_lab", COMLRL_LAB_MKL_AVX512="0")
    late = probe("torch")
    assert loaded["active"] and loaded["branch"].startswith("AVX-512")
    assert not off["active"] and off["reason"] == OFF.reason
    assert not late["active"] and late["reason"] == TORCH_FIRST.reason
    # Without the library MKL runs its generic code on an AMD CPU, whatever its instruction sets.
    assert off["branch"] == late["branch"] == "generic (MKL's code for a CPU that is not Intel's)"
    # Other kernels, the same product: each within fp32 rounding of the float64 one (128-term sums of N(0,1) products).
    for run in (loaded, off, late):
        assert run["error"] < 1e-5


def test_importing_comlrl_lab_does_not_import_torch():
    # Otherwise the decision would always come too late; the configs and the CLI's --help stay cheap for the same reason.
    code = "import sys, comlrl_lab; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "False"
