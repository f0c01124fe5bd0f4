"""The engine: experiments as specs, runs advanced phase by phase, and a manager that runs them in threads.

Names resolve on first use, so ``from comlrl_lab.engine.spec import ExperimentSpec`` (the CLI reading a spec) does
not import the run machinery, DuckDB or pandas.
"""

from __future__ import annotations

import importlib
from typing import Any

from comlrl_lab.data.phases import InvalidTransition

_LAZY = {
    "ALGORITHMS": "spec",
    "ExperimentSpec": "spec",
    "build_trainer": "spec",
    "Progress": "manager",
    "RunManager": "manager",
    "Run": "run",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = ["ALGORITHMS", "ExperimentSpec", "InvalidTransition", "Progress", "Run", "RunManager", "build_trainer"]
