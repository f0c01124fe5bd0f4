"""MKL's AVX-512 kernels on AMD CPUs: load ``_mkl_dispatch`` before torch, where it applies, and say whether it did.

torch's PyPI wheels multiply fp32 matrices on the CPU with MKL, and MKL keeps to its generic kernels on a CPU that
is not Intel's, AVX-512 or not. On an AMD EPYC (family 26), one thread, the tiny model's and SmolLM2-135M's products
ran at 82-94 GFLOP/s on them and at 191-225 on MKL's AVX-512 kernels (``benchmarks/cpu_gemm.py``), and a small
MADPOIter ``train()`` took about a fifth less time. ``_mkl_dispatch.c`` answers MKL's vendor question "yes"; MKL then
chooses its kernels by the instruction sets the CPU reports, as it does on Intel's CPUs. Only that CPU was measured,
with one thread; other AMD CPUs with AVX-512 (Zen 4) get it too, unmeasured.

MKL asks once, when torch loads, so the library must be in the process's global symbol scope before ``import
torch``: ``comlrl_lab/__init__.py`` calls ``enable()`` first thing. A script that imports torch before comlrl_lab
keeps MKL's generic kernels (``status()`` says so); ``comlrl-lab``, the app and ``python -m comlrl_lab...`` import
comlrl_lab first. ``COMLRL_LAB_MKL_AVX512=0`` turns it off; it is never tried on other CPUs (Intel's already get the
kernels), on other platforms, or where the extension was not built (no C compiler or Python headers at install).
``status()`` says what was done before torch loaded; ``mkl_branch()`` asks MKL what it chose.

It changes which kernels compute a product, not what is computed: products differ from the generic kernels' in the
last bits (summation order); repeated one-thread runs on that machine trained bit-identical weights either way. It
does not touch torch's own kernels, oneDNN or CUDA.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "COMLRL_LAB_MKL_AVX512"
EXTENSION = "comlrl_lab._mkl_dispatch"
CPUINFO = Path("/proc/cpuinfo")
GENERIC = "MKL keeps its generic kernels"

#: MKL's conditional-numerical-reproducibility branches (mkl_cbwr.h): the code path its auto-detection chose. It
#: reports 2 (``MKL_CBWR_AUTO``) on an AMD CPU it has not been told to treat as Intel's.
MKL_BRANCH_NAMES = {
    2: "generic (MKL's code for a CPU that is not Intel's)",
    3: "compatible",
    4: "SSE2",
    6: "SSSE3",
    7: "SSE4.1",
    8: "SSE4.2",
    9: "AVX",
    10: "AVX2",
    11: "AVX-512 (MIC)",
    12: "AVX-512",
    13: "AVX-512 (MIC E1)",
    14: "AVX-512 E1",
}


@dataclass(frozen=True)
class MklDispatch:
    """Whether the library was loaded before torch in this process, and why or why not (one sentence for people)."""

    active: bool
    reason: str


_status = MklDispatch(False, "comlrl_lab.mkl_dispatch.enable() has not run")


def cpu_has_avx512_amd(cpuinfo: str) -> bool:
    """Whether /proc/cpuinfo's text describes an AMD CPU with AVX-512 (the foundation set, ``avx512f``)."""
    vendor = flags = None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "vendor_id" and vendor is None:
            vendor = value.strip()
        elif key == "flags" and flags is None:
            flags = value.split()
        if vendor is not None and flags is not None:
            break
    return vendor == "AuthenticAMD" and "avx512f" in (flags or ())


def decide(environ: Mapping[str, str], torch_imported: bool, cpuinfo: str | None, library: str | None) -> MklDispatch:
    """Whether to load ``library`` (the built extension's path, None when absent), with the reason either way."""
    if environ.get(ENV_VAR, "1").strip().lower() in ("0", "false", "no", "off"):
        return MklDispatch(False, f"turned off by {ENV_VAR}")
    if cpuinfo is None:
        return MklDispatch(False, "not Linux (no /proc/cpuinfo): MKL keeps its own choice of kernels")
    if not cpu_has_avx512_amd(cpuinfo):
        return MklDispatch(
            False, "not an AMD CPU with AVX-512: left to MKL (Intel's CPUs already get its best kernels)"
        )
    if library is None:
        return MklDispatch(False, f"{EXTENSION} was not built (no C compiler or Python headers at install): {GENERIC}")
    if torch_imported:
        return MklDispatch(False, f"torch was imported before comlrl_lab: {GENERIC}")
    return MklDispatch(
        True, "loaded before torch: MKL chooses its kernels by this AMD CPU's instruction sets (AVX-512)"
    )


def library_path() -> str | None:
    """The built extension's file, or None where it was not built."""
    spec = importlib.util.find_spec(EXTENSION)
    return spec.origin if spec is not None and spec.origin else None


def _read_cpuinfo() -> str | None:
    """The first processor's block of /proc/cpuinfo (the rest repeat it; on a large host the file is long and every
    ``import comlrl_lab`` reads it), or None where there is none."""
    lines = []
    try:
        with CPUINFO.open(encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip() and lines:
                    break
                lines.append(line)
    except OSError:
        return None
    return "".join(lines)


def enable() -> MklDispatch:
    """Load the extension into the global symbol scope when ``decide`` says so; idempotent. Returns ``status()``."""
    global _status
    if _status.active:
        return _status
    library = library_path()
    decision = decide(os.environ, "torch" in sys.modules, _read_cpuinfo(), library)
    if decision.active:
        try:
            # RTLD_GLOBAL: libtorch_cpu.so, loaded later, resolves MKL's vendor check to this definition.
            ctypes.CDLL(library, mode=os.RTLD_GLOBAL)
        except OSError as error:
            decision = MklDispatch(False, f"{EXTENSION} could not be loaded ({error}): {GENERIC}")
    _status = decision
    return _status


def status() -> MklDispatch:
    """What ``enable()`` decided in this process."""
    return _status


def mkl_branch() -> str | None:
    """The code path MKL's auto-detection chose in this process (imports torch), e.g. "AVX-512 E1"; None where
    torch has no MKL. Asks MKL's service layer, which torch's wheels export; "branch N" for a number we do not know.
    """
    import torch

    if not torch.backends.mkl.is_available():
        return None
    try:
        libtorch = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        branch = int(libtorch.mkl_serv_cbwr_get_auto_branch())
    except (OSError, AttributeError):
        return None
    return MKL_BRANCH_NAMES.get(branch, f"branch {branch}")
