"""Where runs live: ``$COMLRL_LAB_RUNS_DIR``, else ``./runs``; the workbench and the command line agree on it.

A run, a sweep's cells and an imported pair set each get a folder here, which is where the workbench lists them.
"""

from __future__ import annotations

import os
from pathlib import Path

RUNS_DIR_ENV = "COMLRL_LAB_RUNS_DIR"


def runs_root() -> Path:
    """The folder holding every run directory: ``$COMLRL_LAB_RUNS_DIR`` or ``./runs`` (resolved)."""
    return Path(os.environ.get(RUNS_DIR_ENV) or "runs").expanduser().resolve()
