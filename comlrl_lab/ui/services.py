"""Long-lived objects of the workbench: one ``Workspace`` per server process (``st.cache_resource``).

The workspace owns the ``RunManager`` that runs experiments in worker threads, and the stores of imported pair
sets, all under one runs folder (``COMLRL_LAB_RUNS_DIR``, default ``./runs``). Pages reach runs only through it,
by run id; the run directory of a run is ``<runs folder>/<run id>``, so a session that remembers only the id
finds the run again after a server restart. Every run id and folder that arrives from a URL (``?run.open=``) or a
form is confined to the runs folder: a plain folder name directly in it (``run_folder``), never ``..``, an absolute
path or a link out. Nothing here trains, runs SQL or draws widgets: the engine trains, the store owns the SQL, the
pages lay out.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import shutil
import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from comlrl_lab.data.reward_distribution import DISTRIBUTION_DIR
from comlrl_lab.engine import ExperimentSpec, RunManager
from comlrl_lab.engine.exports import export_run
from comlrl_lab.engine.manager import Progress
from comlrl_lab.engine.run import SNAPSHOT_DIR, SPEC_FILE, STORE_FILE, empty_round_notes, quiet_library_progress
from comlrl_lab.engine.runs_folder import RUNS_DIR_ENV, runs_root
from comlrl_lab.names.run_ids import new_run_id
from comlrl_lab.store import (
    EXPORT_FORMATS,
    ROUND_FILES,
    TRL_FILES,
    ImportReport,
    QueryExecutionError,
    ReadOnlyQueryError,
    RunStore,
    import_pair_files,
    import_replay_dir,
)
from comlrl_lab.store.snapshots import run_statuses
from comlrl_lab.trainers.preference.algorithms import algorithm

# Pages import only ``comlrl_lab.ui``; these are the engine and store names they need.
__all__ = [
    "EXPORT_FORMATS",
    "ROUND_FILES",
    "ExperimentSpec",
    "QueryExecutionError",
    "RUNS_DIR_ENV",
    "ReadOnlyQueryError",
    "RunView",
    "Workspace",
    "close_all",
    "dataframe_csv",
    "empty_round_notes",
    "past_runs",
    "runs_root",
    "workspace",
]

UPLOADS_DIR = "_uploads"
ARCHIVE_DIR = "_archive"  # archived runs: kept on disk, out of the run lists (names starting with "_" are skipped)
EXPORTS_DIR = "exports"


@dataclass(frozen=True)
class RunView:
    """What a page needs to show one run: its id, folder, store, and spec (None for an imported pair set)."""

    run_id: str
    run_dir: Path
    store: RunStore
    spec: ExperimentSpec | None

    @property
    def iterative(self) -> bool:
        return self.spec is not None and algorithm(self.spec.algorithm).iterative

    @functools.cached_property
    def settings(self) -> dict[str, Any]:
        """The run's stored settings: every config value, defaults filled in, as the engine validated them (the
        store's ``runs.config_json``), read once per view; {} for an imported pair set."""
        info = self.store.run(self.run_id) if self.spec is not None else None
        return json.loads(info["config_json"]) if info and info["config_json"] else {}

    @property
    def num_rounds(self) -> int | None:
        if self.spec is None:
            return None
        try:
            return self.spec.num_rounds()
        except ValueError:
            return None


class Workspace:
    """The runs folder of this server: engine runs (through ``RunManager``) and imported pair sets."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.manager = RunManager(self.root)
        self._imported: dict[str, RunView] = {}
        self._lock = threading.RLock()

    # Runs ------------------------------------------------------------------------------------------------
    def run_folder(self, name: str | Path) -> Path:
        """``<runs folder>/<name>`` for a run id or a folder in the runs folder; ``ValueError`` for anything that
        would leave it (``..``, an absolute path, a nested path, a link pointing out)."""
        root = self.root.resolve()
        text = str(name)
        path = Path(text).expanduser()
        if path.is_absolute() or len(path.parts) > 1:
            inside = path.resolve() if path.is_absolute() else (root / path).resolve()
            path = Path(inside.name) if inside.parent == root else Path(text)
        if not text or len(path.parts) != 1 or path.name in (".", "..") or "\x00" in text:
            raise ValueError(f"{text!r} is not a run in the runs folder {root}")
        folder = root / path.name
        if folder.resolve().parent != root:
            raise ValueError(f"{text!r} is not a run in the runs folder {root} (it links elsewhere)")
        return folder

    def create_run(self, spec: ExperimentSpec) -> str:
        """Validate and create a run (CoMLRL's messages on a bad config); models load on its first phase."""
        return self.manager.create(spec)

    def open_dir(self, run_dir: str | Path) -> str:
        """Open an engine run (a folder with spec.json) or an imported pair set (run.duckdb only), in the runs
        folder (``run_folder``)."""
        run_dir = self.run_folder(run_dir).resolve()
        if (run_dir / SPEC_FILE).is_file():
            with self._lock:
                return self.manager.open(run_dir)
        if (run_dir / STORE_FILE).is_file():
            with self._lock:
                for view in self._imported.values():
                    if view.run_dir == run_dir:
                        return view.run_id
                store = RunStore(run_dir / STORE_FILE)
                run_id = store.first_run_id() or run_dir.name
                self._imported[run_id] = RunView(run_id, run_dir, store, None)
                return run_id
        raise FileNotFoundError(
            f"{run_dir} is neither a comlrl-lab run (no {SPEC_FILE}) nor a pair store (no {STORE_FILE})"
        )

    def has_run(self, run_id: str) -> bool:
        if run_id in self.manager.open_runs() or run_id in self._imported:
            return True
        try:
            return self.run_folder(run_id).is_dir()
        except ValueError:
            return False

    def view(self, run_id: str) -> RunView:
        """The run ``run_id``, opened from ``<runs folder>/<run id>`` when this process has not seen it yet."""
        with self._lock:
            if run_id in self._imported:
                return self._imported[run_id]
            if run_id not in self.manager.open_runs():
                self.open_dir(self.run_folder(run_id))
            if run_id in self._imported:
                return self._imported[run_id]
            run = self.manager.run(run_id)
            return RunView(run.run_id, run.run_dir, run.store, run.spec)

    def progress(self, run_id: str) -> Progress | None:
        """The engine's live progress of ``run_id`` (opening the run if needed); None for an imported pair set."""
        if run_id not in self.manager.open_runs() and run_id not in self._imported:
            self.view(run_id)
        if run_id in self._imported:
            return None
        return self.manager.progress(run_id)

    def past_runs(self) -> pd.DataFrame:
        """Every run folder under the runs folder, newest first, with what spec.json says about it."""
        rows = []
        for run_dir in self.root.iterdir() if self.root.is_dir() else []:
            if not run_dir.is_dir() or run_dir.name.startswith(("_", ".")):
                continue
            spec_path, store_path = run_dir / SPEC_FILE, run_dir / STORE_FILE
            if spec_path.is_file():
                try:
                    data = json.loads(spec_path.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    data = {}
                config = data.get("config") or {}
                rows.append(
                    {
                        "run_id": run_dir.name,
                        "kind": "experiment",
                        "algorithm": data.get("algorithm"),
                        "task": data.get("task") or data.get("user_task"),
                        "agents": len(data.get("agent_models") or []),
                        "rounds": config.get("num_iterations"),
                        "tags": tuple(t for t in data.get("tags") or () if isinstance(t, str)),
                        "modified": _mtime(run_dir),
                        "path": str(run_dir),
                    }
                )
            elif store_path.is_file():
                rows.append(
                    {
                        "run_id": run_dir.name,
                        "kind": "imported pairs",
                        "algorithm": None,
                        "task": None,
                        "agents": None,
                        "rounds": None,
                        "tags": (),
                        "modified": _mtime(run_dir),
                        "path": str(run_dir),
                    }
                )
        columns = ["run_id", "kind", "algorithm", "task", "agents", "rounds", "tags", "modified", "path"]
        frame = pd.DataFrame(rows, columns=columns)
        return frame.sort_values("modified", ascending=False, ignore_index=True) if len(frame) else frame

    # Work ------------------------------------------------------------------------------------------------
    def start(self, run_id: str, **how: Any) -> None:
        self.manager.start(run_id, **how)

    def pause(self, run_id: str) -> None:
        self.manager.pause(run_id)

    def stop(self, run_id: str) -> None:
        self.manager.stop(run_id)

    # Import / export -------------------------------------------------------------------------------------
    def _new_import_store(self, stem: str) -> tuple[str, Path, RunStore]:
        run_id = new_run_id(stem, prefix="import", fallback="pairs")
        run_dir = self.root / run_id
        run_dir.mkdir(parents=True, exist_ok=False)
        return run_id, run_dir, RunStore(run_dir / STORE_FILE)

    def _import_into_new_store(self, stem: str, do_import: Any) -> ImportReport:
        """Run ``do_import(store, run_id)`` in a new import folder; the folder goes again unless something was
        imported, also when the import fails."""
        run_id, run_dir, store = self._new_import_store(stem)
        try:
            report = do_import(store, run_id)
        except BaseException:
            _discard_folder(run_dir, store)
            raise
        if not report.imported_files:
            _discard_folder(run_dir, store)
            return report
        with self._lock:
            self._imported[report.run_id] = RunView(report.run_id, run_dir, store, None)
        return report

    def import_replay_dir(self, path: str | Path) -> ImportReport:
        """Import a CoMLRL ``preference_replay`` folder as a new pair set of its own (its own run folder)."""
        directory = Path(path).expanduser()
        if not directory.is_dir():
            raise ValueError(f"{str(directory)!r} is not a directory")
        return self._import_into_new_store(
            directory.resolve().name, lambda store, run_id: import_replay_dir(store, directory, run_id=run_id)
        )

    def import_files(self, files: list[Any]) -> ImportReport:
        """Import uploaded JSON / JSONL pair files (one round per file) as a new pair set."""
        stem = Path(str(getattr(files[0], "name", "pairs"))).stem if files else "pairs"
        return self._import_into_new_store(stem, lambda store, run_id: import_pair_files(store, files, run_id=run_id))

    def export(self, run_id: str, fmt: str, filters: dict[str, Any]) -> tuple[Path, int]:
        """Write an export into ``<run dir>/exports/`` and return (path, number of pairs or round files).

        Round files and TRL datasets are folders, returned zipped; a JSONL, Parquet or CSV file gets a folder of its
        own there with its dataset card (README.md) beside it.
        """
        view = self.view(run_id)
        if fmt not in EXPORT_FORMATS:
            raise ValueError(f"unknown export format {fmt!r}")
        target = view.run_dir / EXPORTS_DIR
        target.mkdir(parents=True, exist_ok=True)
        if fmt == ROUND_FILES:
            folder = target / new_run_id("rounds")
            made = export_run(view.store, run_id, fmt, folder)
            distributions = sorted((folder / DISTRIBUTION_DIR).glob("*.json"))
            archive = folder.with_suffix(EXPORT_FORMATS[ROUND_FILES].suffix)
            with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zf:
                for file in made.paths:
                    zf.write(file, arcname=f"preference_replay/{file.name}")
                for file in distributions:
                    zf.write(file, arcname=f"{DISTRIBUTION_DIR}/{file.name}")
            return archive, made.count
        name = new_run_id(("trl" if fmt == TRL_FILES else "pairs") + _filter_suffix(filters))
        if fmt == TRL_FILES:
            folder = target / name
            made = export_run(view.store, run_id, fmt, folder, spec=view.spec, **filters)
            archive = folder.with_suffix(EXPORT_FORMATS[TRL_FILES].suffix)
            with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zf:
                for file in [*made.paths, made.card]:
                    zf.write(file, arcname=f"{name}/{file.name}")
            return archive, made.count
        dest = target / name / (name + EXPORT_FORMATS[fmt].suffix)
        made = export_run(view.store, run_id, fmt, dest, spec=view.spec, **filters)
        return dest, made.count

    def remove_run(self, run_id: str, *, archive: bool) -> Path | None:
        """Archive (move to ``<runs folder>/_archive/``) or delete a run folder; refused while the run works.

        Returns where an archived run went. Only folders directly in the runs folder are touched, never one
        opened from elsewhere.
        """
        with self._lock:
            run_dir = self.view(run_id).run_dir.resolve() if self.has_run(run_id) else None
            if run_dir is None or run_dir.parent != self.root.resolve():
                raise ValueError(f"{run_id} is not a run folder in {self.root}")
            self.manager.forget(run_id)  # raises while a phase runs
            imported = self._imported.pop(run_id, None)
            if imported is not None:
                imported.store.close()
            if not archive:
                shutil.rmtree(run_dir)
                return None
            target = self.root / ARCHIVE_DIR / run_dir.name
            target.parent.mkdir(exist_ok=True)
            shutil.move(str(run_dir), str(target))
            return target

    def close(self) -> None:
        """Stop running work (the run returns to its last finished phase) and close every store."""
        self.manager.close()
        with self._lock:
            for view in self._imported.values():
                view.store.close()
            self._imported.clear()

    # Uploads ---------------------------------------------------------------------------------------------
    def save_upload(self, name: str, data: bytes) -> Path:
        """Keep an uploaded task module or data file under ``<runs folder>/_uploads/<hash>/<name>``."""
        digest = hashlib.sha256(data).hexdigest()[:12]
        folder = self.root / UPLOADS_DIR / digest
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / Path(name).name
        if not path.exists():
            path.write_bytes(data)
        return path


def _discard_folder(run_dir: Path, store: RunStore) -> None:
    store.close()
    for leftover in sorted(run_dir.rglob("*"), reverse=True):
        leftover.unlink() if leftover.is_file() else leftover.rmdir()
    run_dir.rmdir()


def _mtime(path: Path) -> pd.Timestamp:
    return pd.Timestamp(path.stat().st_mtime, unit="s")


def _filter_suffix(filters: dict[str, Any]) -> str:
    parts = []
    if filters.get("round") is not None:
        parts.append(f"r{int(filters['round']):04d}")
    if filters.get("winner_side"):
        parts.append(str(filters["winner_side"]))
    if filters.get("item") is not None:
        parts.append(f"item{int(filters['item'])}")
    if any(filters.get(k) is not None for k in ("min_gap", "max_gap")) or filters.get("text"):
        parts.append("filtered")
    return ("-" + "-".join(parts)) if parts else ""


_OPENED: list[Workspace] = []


@st.cache_resource(show_spinner=False)
def _workspace(root: str) -> Workspace:
    quiet_library_progress()
    workspace = Workspace(root)
    _OPENED.append(workspace)
    return workspace


def close_all() -> None:
    """Close every workspace this process opened and forget the cached one (tests; a clean shutdown)."""
    while _OPENED:
        _OPENED.pop().close()
    _workspace.clear()


def workspace() -> Workspace:
    """This server's workspace (created on first use; shared by every session)."""
    return _workspace(str(runs_root()))


@st.cache_data(show_spinner=False, max_entries=8)
def _past_runs(root: str, stamp: int) -> pd.DataFrame:
    return workspace().past_runs()


def _text(value: Any) -> str | None:
    """A cell of ``past_runs`` as text; None for an empty cell (None or NaN, which pandas makes of None)."""
    return None if value is None or (not isinstance(value, str) and pd.isna(value)) else str(value)


def run_label(row: Any) -> str:
    """How a row of ``past_runs`` reads in a picker: "id — MADPOIter · length_ratio", "id — imported CoMLRL pairs"."""
    if row.kind != "experiment":
        return f"{row.run_id} — imported CoMLRL pairs"
    parts = [p for p in (_text(row.algorithm), _text(row.task)) if p]
    return f"{row.run_id} — {' · '.join(parts)}" if parts else str(row.run_id)


#: What a run's stored status (``runs.status``, as its snapshot has it) reads as in the run list when this server
#: has not opened the run: a run with rounds left is idle whether or not a phase of it ever ran.
STORED_STATUS = {
    "finished": "finished",
    "failed": "error",
    "interrupted": "interrupted",
    "running": "idle",
    "created": "idle",
}


@st.cache_data(show_spinner=False, max_entries=8)
def _stored_statuses(root: str, run_ids: tuple[str, ...], stamps: tuple[int, ...]) -> dict[str, str]:
    # ``stamps`` (each run's runs.parquet mtime) is only part of the cache key: a new snapshot reads again.
    return run_statuses([Path(root) / run_id / SNAPSHOT_DIR for run_id in run_ids])


def run_list() -> pd.DataFrame:
    """``past_runs`` with a ``status`` column: the engine's status for runs this server has open, else the status
    the run's snapshot recorded (finished, error, idle; "imported" for an imported pair set), read again only when
    a snapshot changes."""
    ws = workspace()
    frame = past_runs().copy()
    open_runs = set(ws.manager.open_runs())
    closed = tuple(
        r.run_id for r in frame.itertuples(index=False) if r.run_id not in open_runs and r.kind == "experiment"
    )
    stamps = tuple(_mtime_ns(ws.root / run_id / SNAPSHOT_DIR / "runs.parquet") for run_id in closed)
    stored = _stored_statuses(str(ws.root), closed, stamps) if closed else {}
    frame["status"] = [
        ws.manager.progress(r.run_id).status
        if r.run_id in open_runs
        else ("imported" if r.kind != "experiment" else STORED_STATUS.get(stored.get(r.run_id, "created"), "idle"))
        for r in frame.itertuples(index=False)
    ]
    return frame


def _mtime_ns(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def past_runs() -> pd.DataFrame:
    """``Workspace.past_runs``, re-read only when a run folder is added or removed (the folder's mtime changes)."""
    root = workspace().root
    return _past_runs(str(root), root.stat().st_mtime_ns if root.exists() else 0)


def dataframe_csv(frame: pd.DataFrame) -> bytes:
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False)
    return buffer.getvalue().encode("utf-8")
