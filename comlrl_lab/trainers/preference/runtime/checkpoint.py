"""Atomic checkpoints after finished phases: weights and optimisers, RNG streams, replay index, cursor.

Layout of ``checkpoint_dir``, one folder per checkpoint, numbered in the order they were committed::

    checkpoint-000001/
        state.json            cursor, replay buffer, pending pairs, counters, fingerprints (small; JSON)
        state.safetensors     the tensors of that state (torch generator states)
        weights-<version>.pt  agent state dicts and optimiser states (tensors, read with weights_only=True)
        cost.json             what writing this checkpoint cost, for the phase's checkpoint/* metrics
    checkpoint-000002/
        ...

A run folder is data, never code: nothing in it is unpickled. The state is JSON and safetensors
(``state_codec``) and the weights files are read with ``torch.load(weights_only=True)``, which builds tensors and
containers only. Checkpoints of format 1 (``state.pt``, a pickle) are read only when the caller trusts them
(``trust_checkpoint=True``, ``comlrl-lab run --resume RUN --trust-checkpoint``); otherwise they are refused with
``UntrustedCheckpoint`` before a byte of them is unpickled.

Version 0 is the trainer's initial weights, which a freshly built trainer already holds, so it has no file: a
checkpoint written before the first train phase is the state file alone. A checkpoint whose weights did not change
since the one before holds a hard link to that weights file (a copy where the file system has none), so each folder
stands alone and costs the disk nothing more.

A checkpoint is written into a hidden staging folder and renamed to its number once every file in it is on disk, so
a process killed at any moment leaves the previous checkpoints intact. ``total_limit`` then deletes the oldest beyond
the limit, never before their successor is committed. A folder that holds ``state.pt`` itself (one checkpoint, or the
single-folder layout of earlier versions) is read as that checkpoint. API keys are never part of a checkpoint:
configs are stored through ``to_dict()``, which drops them. A write that runs out of disk space says so
(``NoSpaceLeft``), and the previous checkpoints stay as they were.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from comlrl_lab.data.no_space import NoSpaceLeft, is_no_space

# torch, safetensors and the state codec (which imports torch) are imported by the functions that write or read
# tensors: the workbench lists checkpoints and their costs on every page, and a page must not load torch (3 s).

STATE_FILE = "state.json"
TENSORS_FILE = "state.safetensors"
COST_FILE = "cost.json"
#: Format 1's state file: a pickle, read only from checkpoints the caller trusts.
LEGACY_STATE_FILE = "state.pt"
CHECKPOINT_PREFIX = "checkpoint-"
CHECKPOINT_FORMAT = 2
LEGACY_FORMAT = 1
INITIAL_WEIGHTS = 0  # the weights version of an untrained trainer; never written
_NUMBERED = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")


@dataclass(frozen=True)
class Written:
    """One committed checkpoint: where, and the bytes written for it (a linked weights file costs none)."""

    path: Path
    num_bytes: int
    cost: dict[str, Any] = field(default_factory=dict)  # what ``describe`` returned, as cost.json holds it


class InitialWeightsCheckpoint(ValueError):
    """A checkpoint at weights version 0 cannot be loaded into a trainer that has trained since: build a new one."""


class UntrustedCheckpoint(ValueError):
    """A format-1 checkpoint (a pickle, which can run code when read) that the caller did not say it trusts."""


def _synced(path: Path, write: Callable[[Any], None]) -> int:
    """``write(handle)`` into ``path``, then fsync; the bytes written."""
    with open(path, "wb") as handle:
        write(handle)
        handle.flush()
        os.fsync(handle.fileno())
    return path.stat().st_size


def _save_synced(obj: Any, path: Path) -> int:
    """``torch.save`` through a Python file, so a full disk surfaces as ENOSPC rather than torch's own words."""
    import torch

    return _synced(path, lambda handle: torch.save(obj, handle))


def _save_state(state: dict[str, Any], directory: Path) -> int:
    """The state as JSON (and its tensors as safetensors) in ``directory``; the bytes written."""
    from safetensors.torch import save as save_tensors

    from comlrl_lab.trainers.preference.runtime import state_codec

    tree, tensors = state_codec.encode(state)
    num_bytes = 0
    if tensors:
        data = save_tensors(tensors)
        num_bytes += _synced(directory / TENSORS_FILE, lambda handle: handle.write(data))
    text = json.dumps(tree, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    return num_bytes + _synced(directory / STATE_FILE, lambda handle: handle.write(text.encode("utf-8")))


def _sync_dir(directory: Path) -> None:
    """Make a rename inside ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def weights_file(directory: Path, version: int) -> Path:
    return directory / f"weights-{version:06d}.pt"


def checkpoint_dirs(root: str | Path) -> list[Path]:
    """The committed checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    numbered = []
    for path in root.iterdir():
        match = _NUMBERED.match(path.name)
        if match and _holds_state(path):
            numbered.append((int(match.group(1)), path))
    return [path for _, path in sorted(numbered)]


def latest_checkpoint(path: str | Path) -> Path | None:
    """The checkpoint a resume from ``path`` uses: the newest under it, or ``path`` itself when it is one."""
    path = Path(path)
    committed = checkpoint_dirs(path)
    if committed:
        return committed[-1]
    return path if _holds_state(path) else None


def _holds_state(path: Path) -> bool:
    return (path / STATE_FILE).is_file() or (path / LEGACY_STATE_FILE).is_file()


def checkpoint_root(path: str | Path) -> Path:
    """Where checkpoints after a resume from ``path`` go: its parent when ``path`` is one numbered checkpoint."""
    path = Path(path)
    if _NUMBERED.match(path.name) and _holds_state(path):
        return path.parent
    return path


def _next_number(root: Path) -> int:
    committed = checkpoint_dirs(root)
    return int(_NUMBERED.match(committed[-1].name).group(1)) + 1 if committed else 1


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
        with open(target, "rb") as handle:
            os.fsync(handle.fileno())


def _find_weights(root: Path, version: int, hint: Path | None) -> Path | None:
    """The file of weights ``version``: in ``hint`` (the checkpoint they were loaded from) first, else the newest
    checkpoint that has it, since the trainer's latest checkpoint is always the newest."""
    places = ([hint] if hint is not None else []) + checkpoint_dirs(root)[::-1] + [root]
    return next((weights_file(p, version) for p in places if weights_file(p, version).is_file()), None)


def save_checkpoint(
    root: str | Path,
    state: dict[str, Any],
    weights: dict[str, Any] | None,
    version: int,
    *,
    total_limit: int | None = None,
    weights_from: str | Path | None = None,
    describe: Callable[[int, float], dict[str, Any]] | None = None,
) -> Written:
    """Commit a new numbered checkpoint under ``root``; then keep the newest ``total_limit``.

    ``weights`` (when given) are written under ``version``; otherwise weights ``version`` must already be in a
    checkpoint (``weights_from`` says which, when the trainer was loaded from an older one) and are linked.
    ``describe(num_bytes, seconds)`` (seconds spent here so far) gives the record kept as ``cost.json`` in the
    checkpoint, committed with it, so a process killed right after the commit loses no record of its cost.
    ``NoSpaceLeft`` when the disk is full; the staging folder is removed and the committed checkpoints stay.
    """
    started = time.monotonic()
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    number = _next_number(root)
    final = root / f"{CHECKPOINT_PREFIX}{number:06d}"
    staging = root / f".{final.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        num_bytes = 0
        if weights is not None:
            num_bytes += _save_synced(weights, weights_file(staging, version))
        elif version != INITIAL_WEIGHTS:
            source = _find_weights(root, version, Path(weights_from) if weights_from is not None else None)
            if source is None:
                raise ValueError(f"weights version {version} is missing from {root}")
            _link_or_copy(source, weights_file(staging, version))
        num_bytes += _save_state({"format": CHECKPOINT_FORMAT, "weights_version": version, **state}, staging)
        cost = describe(num_bytes, time.monotonic() - started) if describe is not None else {}
        if cost:
            _synced(staging / COST_FILE, lambda handle: handle.write(json.dumps(cost).encode("utf-8")))
        _sync_dir(staging)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if is_no_space(error):
            raise NoSpaceLeft(root, f"writing {final.name}") from error
        raise
    os.rename(staging, final)  # the commit
    _sync_dir(root)
    prune_checkpoints(root, total_limit)
    return Written(final, num_bytes, cost)


def prune_checkpoints(root: str | Path, total_limit: int | None) -> list[Path]:
    """Delete all but the newest ``total_limit`` committed checkpoints (None keeps all); the deleted ones.

    Each is first renamed out of the numbered names, so a kill mid-delete never leaves a half checkpoint that a
    resume would read; ``remove_stale_tmp`` clears what such a kill leaves.
    """
    if total_limit is None:
        return []
    return drop_checkpoints(root, checkpoint_dirs(root)[: -int(total_limit)])


def drop_checkpoints(root: str | Path, folders: list[Path]) -> list[Path]:
    """Delete these committed checkpoints of ``root``, each renamed out of the numbered names first; the deleted."""
    root = Path(root)
    for old in folders:
        doomed = root / f".{old.name}.deleting-{os.getpid()}"
        os.rename(old, doomed)
        shutil.rmtree(doomed, ignore_errors=True)
    if folders:
        _sync_dir(root)
    return list(folders)


def remove_stale_tmp(directory: str | Path) -> list[Path]:
    """Remove other processes' staging and half-deleted checkpoints (``.*.tmp-PID``, ``.*.deleting-PID``): a kill
    while saving leaves them, and one run is only ever written by one process (the store's lock), so they are never
    finished."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    pid = str(os.getpid())
    stale = [
        p
        for pattern in (".*.tmp-*", ".*.deleting-*")
        for p in directory.glob(pattern)
        if p.name.rsplit("-", 1)[-1] != pid
    ]
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale


def has_checkpoint(directory: str | Path) -> bool:
    return latest_checkpoint(directory) is not None


def is_legacy(checkpoint: str | Path) -> bool:
    """Whether ``checkpoint`` (one checkpoint folder) is of format 1, whose state file is a pickle."""
    checkpoint = Path(checkpoint)
    return not (checkpoint / STATE_FILE).is_file() and (checkpoint / LEGACY_STATE_FILE).is_file()


#: What ``read_cursor`` gives: the state's format and where the run stood when the checkpoint was written.
CURSOR_KEYS = ("format", "round_index", "phase_index", "finished")


def read_cursor(checkpoint: str | Path, *, trust_checkpoint: bool = False) -> dict[str, Any]:
    """``CURSOR_KEYS`` of one checkpoint folder's state, ``checkpoint_path`` added: where a run stands, read without
    torch from ``state.json`` alone (the workbench asks on every page that opens a run). The tensors file is not
    read, so this is no check that a resume will load (``read_state`` is). A format-1 folder is read whole by
    ``read_state``, under its rules: ``UntrustedCheckpoint`` unless ``trust_checkpoint``."""
    checkpoint = Path(checkpoint)
    if is_legacy(checkpoint):
        state, state_path = read_state(checkpoint, trust_checkpoint=trust_checkpoint), checkpoint / LEGACY_STATE_FILE
    else:
        state_path = checkpoint / STATE_FILE
        state = _checked_format(_read_json(state_path), CHECKPOINT_FORMAT, state_path)
    missing = [key for key in CURSOR_KEYS if key not in state]
    if missing:
        raise ValueError(f"{state_path}: not a readable checkpoint state (no {', '.join(missing)})")
    return {**{key: state[key] for key in CURSOR_KEYS}, "checkpoint_path": str(checkpoint)}


def read_state(checkpoint: str | Path, *, trust_checkpoint: bool = False) -> dict[str, Any]:
    """The small state of one checkpoint folder, ``state["checkpoint_path"]`` added; nothing is unpickled unless the
    folder is of format 1 and ``trust_checkpoint`` is set (``UntrustedCheckpoint`` otherwise, before torch is
    imported)."""
    checkpoint = Path(checkpoint)
    if is_legacy(checkpoint):
        state_path = checkpoint / LEGACY_STATE_FILE
        if not trust_checkpoint:
            raise UntrustedCheckpoint(
                f"{state_path} is a checkpoint of an earlier version (a pickle, which can run code when it is read); "
                "resume it only if you trust where it came from: comlrl-lab run --resume RUN_DIR --trust-checkpoint "
                "(Python: load_checkpoint(..., trust_checkpoint=True))"
            )
        import torch

        state = _checked_format(
            torch.load(state_path, map_location="cpu", weights_only=False), LEGACY_FORMAT, state_path
        )
    else:
        from safetensors.torch import load as load_tensors

        from comlrl_lab.trainers.preference.runtime import state_codec

        state_path = checkpoint / STATE_FILE
        tree = _checked_format(_read_json(state_path), CHECKPOINT_FORMAT, state_path)
        try:
            tensor_path = checkpoint / TENSORS_FILE
            tensors = load_tensors(tensor_path.read_bytes()) if tensor_path.is_file() else {}
            state = state_codec.decode(tree, tensors)
        except (ValueError, OSError, RecursionError) as error:
            raise _unreadable(state_path, error) from None
    state["checkpoint_path"] = str(checkpoint)
    return state


def _read_json(state_path: Path) -> Any:
    try:
        return json.loads(state_path.read_text(encoding="utf-8"))
    except (ValueError, OSError, RecursionError) as error:
        raise _unreadable(state_path, error) from None


def _unreadable(state_path: Path, error: BaseException) -> ValueError:
    reason = (str(error).splitlines() or [type(error).__name__])[0]
    return ValueError(f"{state_path}: not a readable checkpoint state ({reason})")


def _checked_format(state: Any, expected: int, state_path: Path) -> dict[str, Any]:
    if not isinstance(state, dict) or state.get("format") != expected:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{state_path}: unsupported checkpoint format {found!r}")
    return state


def load_checkpoint_state(directory: str | Path, *, trust_checkpoint: bool = False) -> dict[str, Any]:
    """The small state of the checkpoint a resume from ``directory`` uses (cursor, RNG streams, replay index),
    without its weights: reading where a run stands must not load gigabytes. ``state["checkpoint_path"]`` says
    which checkpoint it was."""
    directory = Path(directory)
    remove_stale_tmp(checkpoint_root(directory))
    found = latest_checkpoint(directory)
    if found is None:
        raise FileNotFoundError(f"no checkpoint in {directory} (no {CHECKPOINT_PREFIX}* folder or {STATE_FILE})")
    return read_state(found, trust_checkpoint=trust_checkpoint)


def load_checkpoint(
    directory: str | Path, map_location: Any = "cpu", *, trust_checkpoint: bool = False
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(state, weights) of the checkpoint a resume from ``directory`` uses; weights is None for version 0, the
    initial weights a fresh trainer already holds. Weights are read with ``weights_only=True`` (tensors and plain
    containers only), except from a format-1 checkpoint the caller trusts."""
    import torch

    state = load_checkpoint_state(directory, trust_checkpoint=trust_checkpoint)
    if int(state["weights_version"]) == INITIAL_WEIGHTS:
        return state, None
    found = Path(state["checkpoint_path"])
    path = weights_file(found, state["weights_version"])
    trusted_pickle = trust_checkpoint and is_legacy(found)
    try:
        weights = torch.load(path, map_location=map_location, weights_only=not trusted_pickle)
    except Exception as error:  # weights_only refuses anything but tensors and containers: a tampered file
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(f"{path}: not a readable weights file ({reason})") from None
    return state, weights


def checkpoint_costs(root: str | Path) -> list[dict[str, Any]]:
    """The ``cost.json`` record of every committed checkpoint under ``root`` that has one, oldest first."""
    costs = []
    for folder in checkpoint_dirs(root):
        try:
            cost = json.loads((folder / COST_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(cost, dict):
            costs.append(cost)
    return costs


class BackgroundWriter:
    """``save_checkpoint`` in one background thread, one write at a time, so the next phase starts at once.

    The caller hands over copies that nothing else mutates. The write stays atomic (the folder, renamed last,
    commits it, and pruning runs only after that), so a process killed mid-write resumes from the previous
    checkpoint. ``wait`` blocks until the write in flight has finished and re-raises its error; the thread is not a
    daemon, so a normal exit waits too.
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(
        self,
        root: str | Path,
        state: dict[str, Any],
        weights: dict[str, Any] | None,
        version: int,
        on_done: Callable[[Written, float], None] | None = None,
        **options: Any,
    ) -> None:
        """Start the write once the one before has finished; ``on_done(written, seconds)`` runs in the writer
        thread after the commit."""
        self.wait()

        def write() -> None:
            try:
                started = time.monotonic()
                written = save_checkpoint(root, state, weights, version, **options)
                if on_done is not None:
                    on_done(written, time.monotonic() - started)
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
