"""Sweeps: a grid of config values x seeds, each cell a normal run directory, run K at a time and resumable.

A sweep lives in ``<runs folder>/_sweeps/<sweep id>/sweep.json`` (the manifest: the base spec, the grid, the seeds,
the launcher and every cell with its overrides, run id and state). ``grid_cells`` makes each grid point whole by the
rule the Setup form follows (``fields.inapplicable_to_default`` and ``fields.suggestions``), so a grid over a mode
brings each mode's own fields along; a grid value may also name them (a ``Bundle``). Each cell is an ordinary run in
``<runs folder>/<run id>``, made by ``Run.create`` like any other, whose spec carries the sweep id in ``tags``, so the
workbench, the CLI and notebooks read it as they read any run; a finished base run (the Compare page's) stands for
the cell with its own config and is not run again (``sweep_memberships`` finds it). ``SweepRunner`` steps the cells through a ``RunManager`` (the workbench's
own, or one of its own in the CLI), at most ``parallel`` at a time, and writes the manifest after every change of
state; ``Sweep.open`` + ``SweepRunner`` finishes an interrupted sweep, resuming a started cell from its checkpoint.
Cells run as cluster jobs (``cluster.py``) change only their own cell, through ``Sweep.editing`` (a file lock
around reading, changing and writing the manifest), so any number of jobs can finish at once.
``check_sweep_size`` bounds a sweep before anything is written: more than ``MAX_SWEEP_CELLS`` cells, or more disk than
is free, is refused unless confirmed (``--yes``, the Compare page's checkbox), with the cells, disk and time shown.

This module does not parse the command line and draws nothing: ``cli.py`` and the pages call it.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from filelock import FileLock

from comlrl_lab.engine import eta
from comlrl_lab.engine.manager import Progress, RunManager
from comlrl_lab.engine.preflight import preflight
from comlrl_lab.engine.spec import ExperimentSpec
from comlrl_lab.names import metric_names as M
from comlrl_lab.names.phases import PHASES
from comlrl_lab.names.run_ids import new_run_id
from comlrl_lab.store.snapshots import round_metrics, run_statuses
from comlrl_lab.trainers.preference.algorithms import algorithm
from comlrl_lab.trainers.preference.config import ConfigError, check_field_names
from comlrl_lab.trainers.preference.config.fields import (
    JSON,
    FieldSpec,
    applies,
    decode,
    field_specs,
    inapplicable_to_default,
    suggestions,
)

SWEEPS_DIR = "_sweeps"
MANIFEST_FILE = "sweep.json"
LOCK_FILE = "sweep.json.lock"
#: Where a run writes its Parquet snapshots, and the file there that lists its committed phases (store/export.py).
SNAPSHOT_MANIFEST = Path("snapshots") / "_manifest.json"
#: Cell states of work under way: a job queued (submitted, or requeued after a pre-emption or time-out) or running.
ACTIVE_STATES = ("submitted", "running", "requeued")
#: Cells a sweep may have before it must be confirmed (``comlrl-lab sweep --yes``, or the Compare page's checkbox).
MAX_SWEEP_CELLS = 64


# Grid parsing ----------------------------------------------------------------------------------------------------
#: Where a grid value's bundle starts: a colon followed by ``NAME=``, so ``cuda:0`` or a URL's port stay one value.
_BUNDLE_SPLIT = re.compile(r":(?=\s*[A-Za-z_]\w*\s*=)")


@dataclass(frozen=True)
class Bundle:
    """A grid value that brings values of other fields along: ``nearest_k:k=4`` on the command line is
    ``Bundle("nearest_k", {"preference_replay_k": 4})`` for the grid field preference_replay_mode."""

    value: Any
    extra: dict[str, Any] = field(hash=False)

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "with": dict(self.extra)}


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


def parse_grid(config_class: type, entries: list[str]) -> dict[str, list[Any]]:
    """``["dpo_beta=0.1,0.5", ...]`` -> ``{"dpo_beta": [0.1, 0.5], ...}``, each value read by the field's codec.

    A value may bring other fields along (``preference_replay_mode=nearest_k:k=4,lambda_decay``): after a colon,
    ``NAME=VALUE`` pairs (colon-separated) where NAME is a field's full name, or its name without the grid field's
    prefix (``k`` and ``lambda`` for preference_replay_mode); that value becomes a ``Bundle``. Unknown fields (with
    the closest name), unreadable values and a bundled field that does not apply under its value raise
    ``ValueError`` naming the field.
    """
    grid: dict[str, list[Any]] = {}
    for entry in entries:
        name, sep, raw = entry.partition("=")
        if not sep or not name.strip() or not raw.strip():
            raise ValueError(f"a grid entry must read FIELD=V1,V2,..., got {entry!r}")
        name = name.strip()
        check_field_names(config_class, [name])
        if name == "seed":
            raise ValueError("seed is swept with --seeds N, not in the grid")
        if name in grid:
            raise ValueError(f"grid field {name} is given twice")
        try:
            values = [_grid_value(config_class, name, text) for text in split_values(raw)]
        except ConfigError as error:
            raise ConfigError(f"grid field {name}: {error}", field=error.field, value=error.value) from None
        if len({_value_key(v) for v in values}) != len(values):
            raise ValueError(f"grid field {name} repeats a value: {raw}")
        grid[name] = values
    return grid


def _grid_value(config_class: type, name: str, text: str) -> Any:
    """One value of grid field ``name``: the field's value, or a ``Bundle`` when ``text`` brings fields along."""
    specs = field_specs(config_class)
    head, *assignments = [text] if specs[name].kind == JSON else _BUNDLE_SPLIT.split(text)
    value = decode(specs[name], head)
    extra: dict[str, Any] = {}
    for assignment in assignments:
        given, _, raw = assignment.partition("=")
        target = _bundled_field(specs, name, given.strip(), value, text)
        try:
            extra[target] = decode(specs[target], raw)
        except ConfigError as error:
            raise ConfigError(f"{text!r} sets {target}: {error}", field=target, value=raw) from None
    return Bundle(value, extra) if extra else value


def _bundled_field(specs: dict[str, FieldSpec], name: str, given: str, value: Any, text: str) -> str:
    """The field that ``given`` names in a bundle of grid field ``name``: a field's full name, or the name without
    ``name``'s prefix; it must apply when ``name`` is ``value``."""
    prefix = name.rsplit("_", 1)[0] + "_"
    target = given if given in specs else prefix + given
    if target not in specs or target == name:
        own = [
            n.removeprefix(prefix)
            for n, s in specs.items()
            if name in s.applies_when and applies(specs, n, {name: value})
        ]
        offer = f"; with {value} go {', '.join(own)}, or any field by its full name" if own else ""
        raise ConfigError(f"{text!r} names no field {given!r}{offer}", field=name, value=text)
    if not applies(specs, target, {name: value}):
        raise ConfigError(
            f"{text!r} sets {target}, which does not apply when {name}={value!r}", field=target, value=text
        )
    return target


def _value_key(value: Any) -> str:
    return json.dumps(value.to_json() if isinstance(value, Bundle) else value, sort_keys=True, default=str)


def grid_cells(spec: ExperimentSpec, grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The config overrides of every grid point (seeds aside), made whole by the Setup form's rule: a field that does
    not apply in the cell takes its default (a grid value or a base value meant for another mode is dropped), and
    one that applies but is empty takes its suggested value (``fields.suggestions``: k 2 under nearest_k, λ 0.5
    under lambda_decay), unless a ``Bundle`` gave it. Points that come out the same are one cell; a grid field that
    applies in no cell is refused (``ValueError``)."""
    specs = field_specs(spec.config_class)
    base = {**{name: s.default for name, s in specs.items()}, **spec.config}
    cells: dict[str, dict[str, Any]] = {}
    used: set[str] = set()
    for combo in itertools.product(*grid.values()):
        chosen: dict[str, Any] = {}
        for name, value in zip(grid, combo, strict=True):
            chosen[name] = value.value if isinstance(value, Bundle) else value
            chosen.update(value.extra if isinstance(value, Bundle) else {})
        values = inapplicable_to_default(specs, {**base, **chosen})
        values.update(suggestions(specs, values))
        overrides = {n: values[n] for n in chosen if applies(specs, n, values)}
        overrides.update((n, v) for n, v in values.items() if n not in overrides and v != base[n])
        used.update(n for n in grid if n in overrides)
        cells.setdefault(_value_key(overrides), overrides)
    for name in grid:
        if name not in used:
            when = " and ".join(f"{c} is {' or '.join(map(str, v))}" for c, v in specs[name].applies_when.items())
            raise ValueError(
                f"grid field {name} applies in no cell: only when {when}; set that in the spec, or in the grid"
            )
    return list(cells.values())


# The size of a sweep ---------------------------------------------------------------------------------------------
class SweepTooLarge(ValueError):
    """A sweep past the cell cap or the free disk, not confirmed; the message shows its size."""


@dataclass(frozen=True)
class SweepSize:
    """What a sweep would cost: cells, and the disk and time estimated from a finished run (``basis`` says which)."""

    cells: int
    disk_bytes: int | None
    seconds: float | None
    free_bytes: int | None
    basis: str

    @property
    def over_disk(self) -> bool:
        return self.disk_bytes is not None and self.free_bytes is not None and self.disk_bytes > self.free_bytes

    @property
    def too_large(self) -> bool:
        return self.cells > MAX_SWEEP_CELLS or self.over_disk

    def describe(self) -> str:
        disk = "disk unknown" if self.disk_bytes is None else f"about {_bytes(self.disk_bytes)} on disk"
        if self.free_bytes is not None:
            disk += f" ({_bytes(self.free_bytes)} free)"
        time_ = "time unknown" if self.seconds is None else f"about {_duration(self.seconds)} one cell at a time"
        return f"{self.cells} cells, {disk}, {time_} ({self.basis})"


def check_sweep_size(
    spec: ExperimentSpec, grid: dict[str, list[Any]], *, seeds: int, runs_root: str | Path, confirmed: bool = False
) -> SweepSize:
    """The sweep's size; ``SweepTooLarge`` (one line, nothing written) when it passes the cap or the free disk and
    ``confirmed`` is not set. The CLI and the Compare page call this before ``Sweep.create``."""
    size = sweep_size(spec, grid, seeds=seeds, runs_root=runs_root)
    if size.too_large and not confirmed:
        over = "more disk than is free" if size.over_disk else f"more than {MAX_SWEEP_CELLS} cells"
        raise SweepTooLarge(
            f"the sweep is too large: {size.describe()}; {over}. To run it anyway, confirm: --yes on the command line, "
            "'Run it even when it is large' on the Compare page"
        )
    return size


def sweep_size(spec: ExperimentSpec, grid: dict[str, list[Any]], *, seeds: int, runs_root: str | Path) -> SweepSize:
    """Cells, and disk and time scaled by rounds from the newest finished run of the same algorithm and models
    under ``runs_root``; without one, the disk from the model files (each round's weights and AdamW moments)."""
    points = grid_cells(spec, grid)
    cells = int(seeds) * len(points)
    total_rounds = int(seeds) * sum(_rounds(spec, overrides) for overrides in points)
    root = Path(runs_root)
    free = _free_bytes(root)
    reference = _reference_run(spec, root)
    if reference is not None:
        run_dir, ref_rounds, seconds = reference
        per_round = _folder_bytes(run_dir) / max(1, ref_rounds)
        basis = f"scaled by rounds from run {run_dir.name}"
        per_second = None if seconds is None else seconds / max(1, ref_rounds)
        return SweepSize(
            cells,
            int(per_round * total_rounds),
            None if per_second is None else per_second * total_rounds,
            free,
            basis,
        )
    weights = _model_bytes(spec)
    if weights is None:
        return SweepSize(cells, None, None, free, "no finished run of these models to measure from")
    # Each train phase writes the agents' weights and two AdamW moments; nothing else in a run comes close.
    return SweepSize(cells, 3 * weights * total_rounds, None, free, "disk from the model files; no finished run yet")


def _rounds(spec: ExperimentSpec, overrides: dict[str, Any]) -> int:
    if not algorithm(spec.algorithm).iterative:
        return 1
    values = {**spec.config, **overrides}
    return int(values.get("num_iterations", _field_default(spec.config_class, "num_iterations")))


def _field_default(config_class: type, name: str) -> Any:
    return next(f.default for f in fields(config_class) if f.name == name)


def _free_bytes(root: Path) -> int | None:
    for folder in (root, *root.parents):
        if folder.exists():
            return shutil.disk_usage(folder).free
    return None


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and "exports" not in p.parts)


def _model_bytes(spec: ExperimentSpec) -> int | None:
    """The agents' weight files on disk, when every model is a local folder (the embedded model included)."""
    from comlrl_lab.models.loading import resolve_model_source  # imports torch, which opening a page must not

    total = 0
    for name in spec.agent_models:
        try:
            folder = Path(resolve_model_source(name))
        except OSError:  # the embedded model, not built
            return None
        if not folder.is_dir():
            return None
        total += sum(p.stat().st_size for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".gguf"))
    return total


def _reference_run(spec: ExperimentSpec, root: Path) -> tuple[Path, int, float | None] | None:
    """(run folder, rounds done, seconds its phases took) of the newest finished run of the same algorithm and
    models; read from spec.json and the Parquet snapshots, never from a store another process may hold."""
    found = []
    for folder in root.iterdir() if root.is_dir() else []:
        try:
            data = json.loads((folder / "spec.json").read_text(encoding="utf-8"))
            done = json.loads((folder / "snapshots" / "_manifest.json").read_text(encoding="utf-8"))["phases"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if data.get("algorithm") != spec.algorithm or data.get("agent_models") != list(spec.agent_models):
            continue
        rounds = {int(key[6:10]) for key in done if key.endswith("_evaluate")}
        if rounds:
            found.append((folder.stat().st_mtime, folder, len(rounds)))
    if not found:
        return None
    _, folder, rounds = max(found)
    metrics = round_metrics([folder / "snapshots"], [M.name(M.PHASE_SECONDS, phase=p) for p in PHASES])
    seconds = float(metrics["value"].sum()) if len(metrics) else None
    return folder, rounds, seconds or None


def _bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} TB"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# The manifest ----------------------------------------------------------------------------------------------------
@dataclass
class SweepCell:
    """One run of the sweep: its config overrides (grid values and seed), and where it stands."""

    index: int
    overrides: dict[str, Any]
    run_id: str | None = None
    # pending | submitted | running | requeued | finished | stopped | error; a resume picks up all but finished
    # (and, for cluster jobs, all but those whose job is still queued or running: cluster.py).
    status: str = "pending"
    error: str | None = None
    job_id: str | None = None  # the cluster job that runs (or last ran) the cell; None for the local launcher
    attempts: int = 0  # job starts of the cell: a requeue or a resubmission after a lost job adds one


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
    # How the cells run: {"kind": "local"} (threads of one process) or a cluster launcher with its options.
    launcher: dict[str, Any] = field(default_factory=lambda: {"kind": "local"})

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
        launcher: dict[str, Any] | None = None,
        base_run: str | Path | None = None,
    ) -> Sweep:
        """Validate every cell's config (CoMLRL's messages), then write the manifest; no run starts here.

        ``base_run`` is the run folder ``spec`` was read from (the Compare page's base run): a cell with that run's
        settings and seed is not run again but counts that run as its own, once it has finished. A grid all of
        whose cells are the base run is refused.
        """
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
        sweep.launcher = dict(launcher or {"kind": "local"})
        for index, (overrides, seed) in enumerate(itertools.product(grid_cells(spec, grid), seed_values)):
            sweep.cells.append(SweepCell(index, {**overrides, "seed": seed}))
        base = _finished_base(spec, base_run)
        local = sweep.launcher.get("kind", "local") == "local"
        for cell in sweep.cells:
            cell_spec = sweep.cell_spec(cell)
            config = cell_spec.validated_config()
            if local:  # what `run` checks before a run folder exists (devices, models, task), for every cell now
                try:
                    preflight(cell_spec, config)
                except (ValueError, FileNotFoundError) as error:
                    settings = ", ".join(f"{k}={v}" for k, v in cell.overrides.items())
                    raise ValueError(
                        f"cell {cell.index} ({settings}): {str(error).rstrip('.')}; no cell was started"
                    ) from None
            if base is not None and config.to_dict() == base[1]:
                cell.run_id, cell.status = base[0], "finished"
        if base_run is not None and not sweep.unfinished:
            raise ValueError(
                "every cell of this grid is the base run itself: give a field other values, or more than one seed"
            )
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
        spec = ExperimentSpec.from_dict(data["spec"])
        return cls(
            sweep_dir,
            data["sweep_id"],
            spec,
            _grid_from_json(spec.config_class, data["grid"]),
            list(data["seeds"]),
            int(data.get("parallel", 1)),
            [SweepCell(**cell) for cell in data["cells"]],
            dict(data.get("launcher", {"kind": "local"})),
        )

    def save(self) -> None:
        """Write the manifest atomically (a kill mid-write leaves the previous one)."""
        data = {
            "sweep_id": self.sweep_id,
            "spec": self.spec.to_dict(),
            "grid": {name: [v.to_json() if isinstance(v, Bundle) else v for v in vs] for name, vs in self.grid.items()},
            "seeds": self.seeds,
            "parallel": self.parallel,
            "launcher": self.launcher,
            "cells": [asdict(cell) for cell in self.cells],
        }
        tmp = self.sweep_dir / (MANIFEST_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False), encoding="utf-8")
        tmp.replace(self.sweep_dir / MANIFEST_FILE)

    @contextlib.contextmanager
    def editing(self, timeout: float = -1) -> Iterator[list[SweepCell]]:
        """The cells as they are on disk now, to change in place; saved on exit. Under the manifest's file lock, so
        jobs in other processes (or on other nodes) that finish at once each keep their change; ``timeout``
        seconds (forever when negative) before ``filelock.Timeout``."""
        with FileLock(self.sweep_dir / LOCK_FILE, timeout=timeout):
            self.cells = Sweep.open(self.sweep_dir).cells
            yield self.cells
            self.save()

    def cell_spec(self, cell: SweepCell) -> ExperimentSpec:
        """The experiment of one cell: the base spec with the cell's overrides and the sweep's tag."""
        spec = copy.deepcopy(self.spec)
        spec.config.update(cell.overrides)
        spec.tags = [*spec.tags, self.tag] if self.tag not in spec.tags else spec.tags
        spec.name = f"{self.spec.name or self.spec.algorithm}-c{cell.index:03d}"
        return spec

    def cell_phases(self, cell: SweepCell) -> int:
        """Phases in one cell's run: those of one round (four, five with a label phase) times its rounds
        (num_iterations and preference_source may themselves be swept)."""
        spec = self.cell_spec(cell)
        return spec.num_rounds() * len(spec.round_phases())

    @property
    def unfinished(self) -> list[SweepCell]:
        return [cell for cell in self.cells if cell.status != "finished"]

    def phases_done(self, cell: SweepCell, total: int | None = None) -> int:
        """Phases the cell's run has finished (all ``total`` of them once the cell has), counted in its snapshot
        manifest, which every process may read while another one writes the run."""
        total = self.cell_phases(cell) if total is None else total
        if cell.status == "finished" or cell.run_id is None:
            return total if cell.status == "finished" else 0
        try:
            data = json.loads((self.runs_root / cell.run_id / SNAPSHOT_MANIFEST).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return 0
        return min(total, len(data.get("phases", {}))) if isinstance(data, dict) else 0

    def progress(self, states: list[str] | None = None) -> SweepProgress:
        """The sweep at a glance from its files alone, so any process can follow it: cells by state (``states``,
        one per cell, where the caller knows more than the manifest, e.g. that a job was lost), phases done from
        the runs' snapshots."""
        states = [c.status for c in self.cells] if states is None else states
        phases = [self.cell_phases(c) for c in self.cells]
        done = [self.phases_done(c, total) for c, total in zip(self.cells, phases, strict=True)]
        return SweepProgress(
            sweep_id=self.sweep_id,
            cells=len(self.cells),
            finished=states.count("finished"),
            running=states.count("running"),
            errors=states.count("error"),
            phases_done=sum(done),
            phases_total=sum(phases),
            busy=any(s in ACTIVE_STATES for s in states),
        )


def _grid_from_json(config_class: type, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """The grid as ``Sweep.save`` wrote it, bundles (``{"value", "with"}`` objects, of a field whose values are
    never objects) back as ``Bundle``s."""
    specs = field_specs(config_class)

    def value(name: str, item: Any) -> Any:
        if isinstance(item, dict) and specs[name].kind != JSON and set(item) == {"value", "with"}:
            return Bundle(item["value"], dict(item["with"]))
        return item

    return {name: [value(name, item) for item in items] for name, items in grid.items()}


def _finished_base(spec: ExperimentSpec, base_run: str | Path | None) -> tuple[str, dict[str, Any]] | None:
    """(run id, config) of the base run when it has finished, read from its snapshot; else None."""
    if base_run is None:
        return None
    run_dir = Path(base_run)
    if run_statuses([run_dir / SNAPSHOT_MANIFEST.parent]).get(run_dir.name) != "finished":
        return None
    return run_dir.name, spec.validated_config().to_dict()


def sweep_memberships(runs_root: str | Path) -> dict[str, tuple[str, ...]]:
    """Run id -> the sweeps that count it as a cell, from their manifests: a grid's base run belongs to the sweeps
    that reuse it as well as to those whose tag it carries."""
    found: dict[str, list[str]] = {}
    for path in sorted((Path(runs_root) / SWEEPS_DIR).glob(f"*/{MANIFEST_FILE}")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            run_ids = [cell["run_id"] for cell in data["cells"] if cell.get("run_id")]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        for run_id in run_ids:
            found.setdefault(run_id, []).append(data["sweep_id"])
    return {run_id: tuple(ids) for run_id, ids in found.items()}


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
        # The lock of each cell this runner runs (``cluster.cell_lock``), held while it runs and freed by the operating
        # system when the process dies: what tells ``sweep status`` a running cell from a killed one.
        self._locks: dict[int, Any] = {}
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
                    self._count(cell, progress)
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
        from filelock import Timeout

        from comlrl_lab.engine.cluster import cell_lock

        lock = cell_lock(self.sweep.sweep_dir, cell.index)
        try:
            lock.acquire(timeout=0)
        except Timeout:  # another process runs this cell now (a second `sweep --resume`)
            self._set(cell, error=f"cell {cell.index} is run by another process; not started here")
            return None
        self._locks[cell.index] = lock
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
            self._unlock(cell)
            return None

    def _unlock(self, cell: SweepCell) -> None:
        lock = self._locks.pop(cell.index, None)
        if lock is not None:
            lock.release()

    def _count(self, cell: SweepCell, progress: Progress) -> None:
        order, next_phase = progress.phases, progress.next_phase
        done = (
            self._phases[cell.index]
            if next_phase is None
            else (progress.round_index - 1) * len(order) + order.index(next_phase)
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
        self._unlock(cell)
        # A finished or stopped cell gives back its models and its DuckDB file; the next cell needs the memory.
        self.manager.release(run_id)

    def _set(self, cell: SweepCell, **changes: Any) -> None:
        with self._lock:
            for name, value in changes.items():
                setattr(cell, name, value)
            self.sweep.save()
