"""Sweeps: a grid of config values x seeds, each cell a normal run directory, run K at a time and resumable.

A sweep lives in ``<runs folder>/_sweeps/<sweep id>/sweep.json`` (the manifest: the base spec, the grid, the seeds
and every cell with its overrides, run id and state). Each cell is an ordinary run in ``<runs folder>/<run id>``,
made by ``Run.create`` like any other, whose spec carries the sweep id in ``tags``, so the workbench, the CLI and
notebooks read it as they read any run. ``SweepRunner`` steps the cells through a ``RunManager`` (the workbench's
own, or one of its own in the CLI), at most ``parallel`` at a time, and writes the manifest after every change of
state; ``Sweep.open`` + ``SweepRunner`` finishes an interrupted sweep, resuming a started cell from its checkpoint.

This module does not parse the command line and draws nothing: ``cli.py`` and the pages call it.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
import time
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from comlrl_lab.data.phases import PHASES
from comlrl_lab.data.run_ids import new_run_id
from comlrl_lab.engine import eta
from comlrl_lab.engine.manager import RunManager
from comlrl_lab.engine.spec import ExperimentSpec
from comlrl_lab.trainers.preference.algorithms import algorithm

SWEEPS_DIR = "_sweeps"
MANIFEST_FILE = "sweep.json"

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_NONE = {"none", "null"}


# Grid parsing ----------------------------------------------------------------------------------------------------
def split_values(text: str) -> list[str]:
    """``"a,[1,2],c"`` -> ``["a", "[1,2]", "c"]``: commas inside brackets or braces belong to a JSON value."""
    values, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            values.append(text[start:i].strip())
            start = i + 1
    values.append(text[start:].strip())
    return values


def _coerce(annotation: Any, text: str) -> Any:
    """``text`` as a value of ``annotation`` (a config field's type); ValueError when it is not one."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        arms = typing.get_args(annotation)
        if type(None) in arms and text.strip().lower() in _NONE:
            return None
        # Narrow types first, so "3" is an int for ``int | str`` and "[1]" a list for ``str | list[str]``.
        order = (bool, int, float, list, dict, str)
        ranked = sorted(
            (a for a in arms if a is not type(None)),
            key=lambda a: order.index(typing.get_origin(a) or a) if (typing.get_origin(a) or a) in order else 99,
        )
        for arm in ranked:
            try:
                return _coerce(arm, text)
            except ValueError:
                continue
        raise ValueError(f"{text!r} is none of {annotation}")
    base = origin or annotation
    stripped = text.strip()
    if base is bool:
        if stripped.lower() in _TRUE:
            return True
        if stripped.lower() in _FALSE:
            return False
        raise ValueError(f"{text!r} is not a bool (true or false)")
    if base is int:
        try:
            return int(stripped)
        except ValueError:
            raise ValueError(f"{text!r} is not an int") from None
    if base is float:
        try:
            return float(stripped)
        except ValueError:
            raise ValueError(f"{text!r} is not a float") from None
    if base in (list, dict):
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError:
            raise ValueError(f"{text!r} is not a JSON {base.__name__}") from None
        if not isinstance(value, base):
            raise ValueError(f"{text!r} is not a JSON {base.__name__}")
        return value
    if base is str:
        return text
    # typing.Any and anything else: JSON when it parses (numbers, lists), the text otherwise.
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        return text


def parse_grid(config_class: type, entries: list[str]) -> dict[str, list[Any]]:
    """``["dpo_beta=0.1,0.5", ...]`` -> ``{"dpo_beta": [0.1, 0.5], ...}``, each value typed by the config field.

    Unknown fields and unparsable values raise ``ValueError`` naming the field, as the configs do.
    """
    hints = typing.get_type_hints(config_class)
    known = {f.name for f in fields(config_class)}
    grid: dict[str, list[Any]] = {}
    for entry in entries:
        name, sep, raw = entry.partition("=")
        name = name.strip()
        if not sep or not name or not raw.strip():
            raise ValueError(f"a grid entry must read FIELD=V1,V2,..., got {entry!r}")
        if name not in known:
            raise ValueError(f"Unknown {config_class.__name__} fields: {name}.")
        if name == "seed":
            raise ValueError("seed is swept with --seeds N, not in the grid")
        if name in grid:
            raise ValueError(f"grid field {name} is given twice")
        try:
            values = [_coerce(hints[name], text) for text in split_values(raw)]
        except ValueError as error:
            raise ValueError(f"grid field {name}: {error}") from None
        if len(set(map(json.dumps, values))) != len(values):
            raise ValueError(f"grid field {name} repeats a value: {raw}")
        grid[name] = values
    return grid


# The manifest ----------------------------------------------------------------------------------------------------
@dataclass
class SweepCell:
    """One run of the sweep: its config overrides (grid values and seed), and where it stands."""

    index: int
    overrides: dict[str, Any]
    run_id: str | None = None
    # pending | running | finished | stopped | error; all but finished are work that a resume picks up.
    status: str = "pending"
    error: str | None = None


@dataclass
class Sweep:
    """The manifest of a sweep. Build with ``Sweep.create`` (new) or ``Sweep.open`` (an existing folder)."""

    sweep_dir: Path
    sweep_id: str
    spec: ExperimentSpec
    grid: dict[str, list[Any]]
    seeds: list[int]
    parallel: int = 1
    cells: list[SweepCell] = field(default_factory=list)

    @property
    def runs_root(self) -> Path:
        return self.sweep_dir.parent.parent

    @property
    def tag(self) -> str:
        return self.sweep_id

    @classmethod
    def create(
        cls,
        spec: ExperimentSpec,
        grid: dict[str, list[Any]],
        *,
        seeds: int,
        runs_root: str | Path,
        parallel: int = 1,
        name: str | None = None,
    ) -> Sweep:
        """Validate every cell's config (CoMLRL's messages), then write the manifest; no run starts here."""
        if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
            raise ValueError(f"seeds must be an integer >= 1, got {seeds!r}")
        if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
            raise ValueError(f"parallel must be an integer >= 1, got {parallel!r}")
        # Seeds count up from the spec's own seed, so a sweep of one seed reruns exactly the spec. The base spec
        # alone need not be valid (the grid may supply what it lacks), so its config is not built here.
        (seed_field,) = (f for f in fields(spec.config_class) if f.name == "seed")
        base_seed = int(spec.config.get("seed", seed_field.default))
        seed_values = [base_seed + offset for offset in range(seeds)]
        sweep_id = new_run_id(name or spec.name, prefix="sweep")
        sweep = cls(Path(runs_root) / SWEEPS_DIR / sweep_id, sweep_id, copy.deepcopy(spec), grid, seed_values, parallel)
        names = list(grid)
        for index, combo in enumerate(itertools.product(*(grid[n] for n in names), seed_values)):
            overrides = dict(zip([*names, "seed"], combo, strict=True))
            sweep.cells.append(SweepCell(index, overrides))
        for cell in sweep.cells:
            sweep.cell_spec(cell).build_config()
        sweep.sweep_dir.mkdir(parents=True, exist_ok=False)
        sweep.save()
        return sweep

    @classmethod
    def open(cls, sweep_dir: str | Path) -> Sweep:
        sweep_dir = Path(sweep_dir)
        path = sweep_dir / MANIFEST_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{sweep_dir} is not a comlrl-lab sweep (no {MANIFEST_FILE})")
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(
            sweep_dir,
            data["sweep_id"],
            ExperimentSpec.from_dict(data["spec"]),
            data["grid"],
            list(data["seeds"]),
            int(data.get("parallel", 1)),
            [SweepCell(**cell) for cell in data["cells"]],
        )

    def save(self) -> None:
        """Write the manifest atomically (a kill mid-write leaves the previous one)."""
        data = {
            "sweep_id": self.sweep_id,
            "spec": self.spec.to_dict(),
            "grid": self.grid,
            "seeds": self.seeds,
            "parallel": self.parallel,
            "cells": [asdict(cell) for cell in self.cells],
        }
        tmp = self.sweep_dir / (MANIFEST_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
        tmp.replace(self.sweep_dir / MANIFEST_FILE)

    def cell_spec(self, cell: SweepCell) -> ExperimentSpec:
        """The experiment of one cell: the base spec with the cell's overrides and the sweep's tag."""
        spec = copy.deepcopy(self.spec)
        spec.config.update(cell.overrides)
        spec.tags = [*spec.tags, self.tag] if self.tag not in spec.tags else spec.tags
        spec.name = f"{self.spec.name or self.spec.algorithm}-c{cell.index:03d}"
        return spec

    def cell_phases(self, cell: SweepCell) -> int:
        """Phases in one cell's run: four per round (num_iterations may itself be swept)."""
        spec = self.cell_spec(cell)
        rounds = int(getattr(spec.build_config(), "num_iterations", 1)) if algorithm(spec.algorithm).iterative else 1
        return rounds * len(PHASES)

    @property
    def unfinished(self) -> list[SweepCell]:
        return [cell for cell in self.cells if cell.status != "finished"]


# Running ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepProgress:
    """The whole sweep at a glance: cells by state and phases done of all, safe to read from any thread."""

    sweep_id: str
    cells: int
    finished: int
    running: int
    errors: int
    phases_done: int
    phases_total: int
    busy: bool
    eta_seconds: float | None = None  # until every cell is done (``eta.sweep_eta``); None before a cell finished

    @property
    def fraction(self) -> float:
        return min(1.0, self.phases_done / self.phases_total) if self.phases_total else 0.0


class SweepRunner:
    """Runs a sweep's unfinished cells through ``manager``, ``parallel`` at a time; ``start`` in the background."""

    def __init__(self, sweep: Sweep, manager: RunManager, *, parallel: int | None = None, poll_seconds: float = 0.2):
        self.sweep = sweep
        self.manager = manager
        self.parallel = int(parallel or sweep.parallel)
        self.poll_seconds = poll_seconds
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._phases = {cell.index: sweep.cell_phases(cell) for cell in sweep.cells}
        self._done: dict[int, int] = {c.index: self._phases[c.index] for c in sweep.cells if c.status == "finished"}
        self._busy = False
        self._started: dict[int, float] = {}  # cell index -> monotonic time its run started here
        self._cell_seconds: list[float] = []  # how long each cell that finished here took

    # Commands ------------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            raise RuntimeError(f"sweep {self.sweep.sweep_id} is already running")
        self._stop.clear()
        self._busy = True
        self._thread = threading.Thread(target=self.run, name=f"comlrl-sweep-{self.sweep.sweep_id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the running cells (each returns to its last finished phase) and start no more."""
        self._stop.set()

    def wait(self, timeout: float | None = None) -> SweepProgress:
        if self._thread is not None:
            self._thread.join(timeout)
        return self.progress()

    def progress(self) -> SweepProgress:
        with self._lock:
            cells = self.sweep.cells
            now = time.monotonic()
            running = [
                now - self._started[c.index] for c in cells if c.status == "running" and c.index in self._started
            ]
            pending = sum(c.status == "pending" for c in cells)
            return SweepProgress(
                sweep_id=self.sweep.sweep_id,
                cells=len(cells),
                finished=sum(c.status == "finished" for c in cells),
                running=sum(c.status == "running" for c in cells),
                errors=sum(c.status == "error" for c in cells),
                phases_done=sum(self._done.values()),
                phases_total=sum(self._phases.values()),
                busy=self._busy,
                eta_seconds=eta.sweep_eta(self._cell_seconds, running, pending, self.parallel) if self._busy else None,
            )

    # Work ----------------------------------------------------------------------------------------------------
    def run(self) -> SweepProgress:
        """Run every unfinished cell to its end (or until ``stop``); blocking. Returns the final progress."""
        self._busy = True
        pending = list(self.sweep.unfinished)
        active: dict[str, SweepCell] = {}
        try:
            while (pending or active) and not self._stop.is_set():
                while pending and len(active) < self.parallel and not self._stop.is_set():
                    cell = pending.pop(0)
                    run_id = self._launch(cell)
                    if run_id is not None:
                        active[run_id] = cell
                for run_id, cell in list(active.items()):
                    progress = self.manager.progress(run_id)
                    self._count(cell, progress.round_index, progress.next_phase)
                    if not progress.busy:
                        self._settle(cell, run_id, progress.status, progress.last_error)
                        del active[run_id]
                if active:
                    time.sleep(self.poll_seconds)
        finally:
            for run_id, cell in active.items():
                self.manager.stop(run_id)
                progress = self.manager.wait(run_id)
                self._settle(cell, run_id, progress.status, progress.last_error)
            self._busy = False
        return self.progress()

    def _launch(self, cell: SweepCell) -> str | None:
        """Create (or reopen, to resume from its checkpoint) the cell's run and start it; None when nothing to do."""
        try:
            if cell.run_id is not None and (self.sweep.runs_root / cell.run_id).is_dir():
                run_id = self.manager.open(self.sweep.runs_root / cell.run_id)
            else:
                run_id = self.manager.create(self.sweep.cell_spec(cell))
            self._set(cell, run_id=run_id, status="running", error=None)
            progress = self.manager.progress(run_id)
            if progress.next_phase is None:
                self._settle(cell, run_id, "finished", None)
                return None
            self._started[cell.index] = time.monotonic()
            self.manager.start(run_id, rounds=10**6)
            return run_id
        except Exception as error:  # a cell that cannot start must not stop the others
            self._set(cell, status="error", error=f"{type(error).__name__}: {error}")
            return None

    def _count(self, cell: SweepCell, round_index: int, next_phase: str | None) -> None:
        done = (
            self._phases[cell.index]
            if next_phase is None
            else (round_index - 1) * len(PHASES) + PHASES.index(next_phase)
        )
        with self._lock:
            self._done[cell.index] = done

    def _settle(self, cell: SweepCell, run_id: str, status: str, error: str | None) -> None:
        state = {"finished": "finished", "error": "error"}.get(status, "stopped")
        if state == "finished":
            with self._lock:
                self._done[cell.index] = self._phases[cell.index]
                if cell.index in self._started:
                    self._cell_seconds.append(time.monotonic() - self._started[cell.index])
        self._set(cell, status=state, error=error if state == "error" else None)
        # A finished or stopped cell gives back its models and its DuckDB file; the next cell needs the memory.
        self.manager.release(run_id)

    def _set(self, cell: SweepCell, **changes: Any) -> None:
        with self._lock:
            for name, value in changes.items():
                setattr(cell, name, value)
            self.sweep.save()
