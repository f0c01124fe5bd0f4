"""Atomic checkpoints after every finished phase: weights and optimisers, RNG streams, replay index, cursor.

Layout of ``checkpoint_dir``::

    state.pt              cursor, RNG streams, replay buffer, pending pairs, counters (small; rewritten each phase)
    weights-<version>.pt  agent state dicts and optimiser states (written only when training changed them)

Version 0 is the trainer's initial weights, which a freshly built trainer already holds, so it has no file: a
checkpoint written before the first train phase is the state file alone.

Each file is written to a temporary name and renamed, and ``state.pt`` names the weights version it belongs to,
so a process killed at any moment leaves the previous consistent checkpoint. API keys are never part of it:
configs are stored through ``to_dict()``, which drops them.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "state.pt"
CHECKPOINT_FORMAT = 1
INITIAL_WEIGHTS = 0  # the weights version of an untrained trainer; never written


class InitialWeightsCheckpoint(ValueError):
    """A checkpoint at weights version 0 cannot be loaded into a trainer that has trained since: build a new one."""


def _atomic_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(obj, tmp)
    with open(tmp, "rb") as handle:
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def weights_file(directory: Path, version: int) -> Path:
    return directory / f"weights-{version:06d}.pt"


def save_checkpoint(directory: str | Path, state: dict[str, Any], weights: dict[str, Any] | None, version: int) -> Path:
    """Write ``weights`` (when given) under ``version``, then ``state`` pointing at it; prune older weights."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    target = weights_file(directory, version)
    if weights is not None:
        _atomic_save(weights, target)
    elif version != INITIAL_WEIGHTS and not target.exists():
        raise ValueError(f"weights version {version} is missing from {directory}")
    _atomic_save({"format": CHECKPOINT_FORMAT, "weights_version": version, **state}, directory / STATE_FILE)
    for old in directory.glob("weights-*.pt"):
        if old != target:
            old.unlink(missing_ok=True)
    return directory


def remove_stale_tmp(directory: str | Path) -> list[Path]:
    """Remove the ``.*.tmp-PID`` files of other processes: a kill while saving leaves them, and one run is only
    ever written by one process (the store's lock), so they are never finished."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    mine = f".tmp-{os.getpid()}"
    stale = [p for p in directory.glob(".*.tmp-*") if p.is_file() and not p.name.endswith(mine)]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def has_checkpoint(directory: str | Path) -> bool:
    return (Path(directory) / STATE_FILE).is_file()


def load_checkpoint(directory: str | Path, map_location: Any = "cpu") -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(state, weights); weights is None for version 0, the initial weights a fresh trainer already holds."""
    directory = Path(directory)
    remove_stale_tmp(directory)
    state_path = directory / STATE_FILE
    if not state_path.is_file():
        raise FileNotFoundError(f"no checkpoint in {directory} (missing {STATE_FILE})")
    # Our own files: they hold Python records (pairs, RNG states) besides tensors.
    state = torch.load(state_path, map_location=map_location, weights_only=False)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{state_path}: unsupported checkpoint format {state.get('format')!r}")
    if int(state["weights_version"]) == INITIAL_WEIGHTS:
        return state, None
    weights = torch.load(
        weights_file(directory, state["weights_version"]), map_location=map_location, weights_only=False
    )
    return state, weights


class BackgroundWriter:
    """``save_checkpoint`` in one background thread, one write at a time, so the next phase starts at once.

    The caller hands over copies that nothing else mutates. The write stays atomic (the state file, renamed last,
    commits it), so a process killed mid-write resumes from the previous checkpoint. ``wait`` blocks until the
    write in flight has finished and re-raises its error; the thread is not a daemon, so a normal exit waits too.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(
        self, directory: str | Path, state: dict[str, Any], weights: dict[str, Any] | None, version: int
    ) -> None:
        self.wait()

        def write() -> None:
            try:
                save_checkpoint(directory, state, weights, version)
            except BaseException as error:  # handed to the trainer's thread by wait()
                self._error = error

        self._thread = threading.Thread(target=write, name="checkpoint-writer")
        self._thread.start()

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
