"""The one native part: a library that answers MKL's vendor check (comlrl_lab/_mkl_dispatch.c).

Everything else is in pyproject.toml. The extension is optional: without a C compiler the install goes on and
comlrl_lab.mkl_dispatch reports that MKL keeps its generic kernels.
"""

import platform
import sys

from setuptools import Extension, setup

# MKL ships in torch's wheels for x86-64 only; the symbol interposition it relies on is the ELF dynamic linker's.
BUILD_MKL_DISPATCH = sys.platform.startswith("linux") and platform.machine() == "x86_64"

setup(
    ext_modules=[Extension("comlrl_lab._mkl_dispatch", ["comlrl_lab/_mkl_dispatch.c"], optional=True)]
    if BUILD_MKL_DISPATCH
    else [],
)
