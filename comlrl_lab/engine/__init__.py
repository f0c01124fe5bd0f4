"""The engine: experiments as specs, runs advanced phase by phase, and a manager that runs them in threads.

Names resolve on first use, so ``from comlrl_lab.engine.spec import ExperimentSpec`` (the CLI reading a spec) does
not import the run machinery, DuckDB or pandas.
"""

from __future__ import annotations

from comlrl_lab.lazy_imports import lazy_names
from comlrl_lab.names.phases import InvalidTransition

_LAZY = {
    "ALGORITHMS": "spec",
    "ExperimentSpec": "spec",
    "build_trainer": "spec",
    "Progress": "manager",
    "RunManager": "manager",
    "Run": "run",
}


__getattr__ = lazy_names(__name__, _LAZY)


__all__ = ["ALGORITHMS", "ExperimentSpec", "InvalidTransition", "Progress", "Run", "RunManager", "build_trainer"]
