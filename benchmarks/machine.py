"""The machine a benchmark figure was taken on, printed beside every figure: the CPU, its logical CPUs, torch's CPU
kernels and BLAS, and the load average. Ratios move with the CPU (another model, AVX-512 or not), not only with the
code, so docs/benchmarks.md keeps one row per CPU measured.
"""

from __future__ import annotations

import os
import platform


def cpu_identity(cpuinfo: str) -> dict:
    """The first processor's model name, vendor, family and model in ``/proc/cpuinfo`` text (missing keys: None)."""
    found: dict = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if found:
                break  # the first processor's block is enough: the rest repeat it
            continue
        key, _, value = line.partition(":")
        found.setdefault(key.strip(), value.strip())
    return {
        "model_name": found.get("model name"),
        "vendor": found.get("vendor_id"),
        "family": found.get("cpu family"),
        "model": found.get("model"),
    }


def torch_cpu_kernels() -> dict:
    """Our torch's version, the CPU kernels it dispatches to here, and the BLAS it was built with."""
    import torch

    blas = next(
        (
            part.split("=", 1)[1]
            for part in torch.__config__.show().replace(",", " ").split()
            if part.startswith("BLAS_INFO=")
        ),
        None,
    )
    return {"torch": torch.__version__, "capability": torch.backends.cpu.get_cpu_capability(), "blas": blas}


def machine_description() -> dict:
    """What the ratio depends on besides the code: the CPU, its logical CPUs, and torch's CPU kernels.

    Our side's small updates are mostly matrix products, CoMLRL's batch-1 loop mostly per-operation overhead, so the
    same code gives other ratios on other CPUs (docs/benchmarks.md, one row per CPU)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            cpu = cpu_identity(handle.read())
    except OSError:
        cpu = {"model_name": platform.processor() or None, "vendor": None, "family": None, "model": None}
    return {**cpu, "cpus": os.cpu_count(), **torch_cpu_kernels()}


def machine_line(machine: dict) -> str:
    """``machine_description()`` in one line, printed above every table."""
    vendor = ", ".join(
        part
        for part in (
            machine["vendor"],
            machine["family"] and f"family {machine['family']}",
            machine["model"] and f"model {machine['model']}",
        )
        if part
    )
    cpu = f"{machine['model_name'] or 'unknown CPU'}" + (f" ({vendor})" if vendor else "")
    return (
        f"Machine: {cpu}, {machine['cpus']} CPUs; torch {machine['torch']}, {machine['capability']} kernels, "
        f"BLAS {machine['blas'] or 'unknown'}"
    )


def load_line() -> str:
    """The 1-, 5- and 15-minute load averages, as printed with each figure."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"
