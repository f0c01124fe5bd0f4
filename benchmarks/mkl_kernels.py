"""Which code path MKL chose in this process: a read-only question the benchmarks ask to name each figure's kernels.

It asks MKL's service layer, which torch's x86-64 wheels export, and changes nothing: MKL picks its kernels by
itself when torch loads (on a CPU that is not Intel's it keeps its generic code). Imports torch.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

#: MKL's conditional-numerical-reproducibility branches (mkl_cbwr.h): the code path its auto-detection chose. It
#: reports 2 (``MKL_CBWR_AUTO``) on a CPU that is not Intel's.
MKL_BRANCH_NAMES = {
    2: "generic",
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


def mkl_branch() -> str | None:
    """The code path MKL's auto-detection chose in this process, e.g. "AVX-512 E1"; None where torch has no MKL;
    "branch N" for a number not in ``MKL_BRANCH_NAMES``."""
    import torch

    if not torch.backends.mkl.is_available():
        return None
    try:
        libtorch = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        branch = int(libtorch.mkl_serv_cbwr_get_auto_branch())
    except (OSError, AttributeError):
        return None
    return MKL_BRANCH_NAMES.get(branch, f"branch {branch}")
