"""Makes run ids and the names of export files: ``[<prefix>-]<stem>-<YYYYmmdd-HHMMSS>-<hex>``.

Every id the package makes comes from here: the trainer's (no stem), the engine's (the run's name), an imported
pair set's (``import-<file name>``) and an export's file name. The result is always one safe path component,
since a run id names its run directory and its replay folder. This module does not check ids given by a user
(``replay._check_run_id`` does) and does not look for collisions (the store and the file system do). It lives in
``comlrl_lab.names`` since the trainers, the engine, the store's importer and the workbench all make ids.
"""

from __future__ import annotations

import re
import time
import uuid

STAMP_FORMAT = "%Y%m%d-%H%M%S"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_stem(text: str | None, fallback: str) -> str:
    """``text`` with every run of other characters than ``A-Za-z0-9_.-`` made one ``-``; ``fallback`` if empty."""
    # Leading dots would hide the folder; leading or trailing dashes would run into the separators.
    return _UNSAFE.sub("-", text or "").strip("-.") or fallback


def random_hex(digits: int) -> str:
    """``digits`` random hex characters."""
    # uuid4 draws from the OS, not from any seeded stream, so naming a run never shifts training randomness.
    return uuid.uuid4().hex[:digits]


def new_run_id(stem: str | None = None, *, prefix: str | None = None, fallback: str = "run", digits: int = 4) -> str:
    """A new id: ``[<prefix>-][<safe stem>-]<local time>-<digits hex>``; no stem part when ``stem`` is None."""
    parts = [] if prefix is None else [prefix]
    if stem is not None:
        parts.append(safe_stem(stem, fallback))
    return "-".join([*parts, time.strftime(STAMP_FORMAT), random_hex(digits)])
