"""Headless entry point: ``comlrl-lab run SPEC``, ``sweep SPEC --grid F=V1,V2``, ``export RUN_DIR``, ``import DIR``.

``run`` drives the same engine as the workbench, in the foreground, with a progress bar. A run directory can
be resumed with ``comlrl-lab run --resume RUN_DIR`` after a crash or a kill; it continues after the last
finished phase. Started by ``torchrun --nproc_per_node=K -m comlrl_lab.cli run SPEC`` (or the ``comlrl-lab``
script under torchrun), ``run`` becomes data parallel: rank 0 owns the run directory and the store, every rank
collects and trains its share, and a run resumes with any K.

Each command imports what it needs when it runs (torch alone takes seconds), so ``--help`` and a mistake in a spec
answer at once.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from comlrl_lab.data.phases import InvalidTransition
from comlrl_lab.engine.runs_folder import RUNS_DIR_ENV
from comlrl_lab.store.formats import EXPORT_FORMATS, ROUND_FILES


def _dist() -> Any:
    """The torchrun context, or None outside torchrun (told from the environment, without importing torch)."""
    if os.environ.get("WORLD_SIZE", "1").strip() in ("", "1"):
        return None
    from comlrl_lab.trainers.preference.distributed import DistContext

    dist = DistContext.from_env()
    return dist if dist.enabled else None


def _load_spec(args: argparse.Namespace) -> Any:
    from comlrl_lab.engine.spec import ExperimentSpec

    spec = ExperimentSpec.load(args.spec)
    if args.rounds is not None:
        spec.config["num_iterations"] = args.rounds
    return spec


def _run_ranks(args: argparse.Namespace, dist: Any) -> int:
    """``run`` under torchrun: every rank steps the run in the foreground; rank 0 prints."""
    from comlrl_lab.engine.run import run_data_parallel

    spec = None
    if not args.resume:
        if not args.spec:
            print("comlrl-lab run: give a SPEC file or --resume RUN_DIR", file=sys.stderr)
            return 2
        spec = _load_spec(args)
    quiet = args.quiet or not dist.is_main
    run = run_data_parallel(
        dist, spec=spec, resume=args.resume, runs_root=args.runs_root, log=(lambda _line: None) if quiet else print
    )
    if dist.is_main:
        print(f"finished: {dist.world_size} ranks, results in {run.run_dir}")
    return 0


def bar_text(progress: Any) -> tuple[str, str, str | None]:
    """(description, unit, ETA of all the queued work) of the progress bar for one ``Progress``."""
    from comlrl_lab.engine.manager import PHASE_UNITS

    rounds = f"/{progress.num_rounds}" if progress.num_rounds else ""
    phase = progress.phase or progress.next_phase
    if progress.status == "loading":
        return "loading models", "step", _eta_text(progress.queue_eta())
    if phase is None:
        return f"done: {progress.shown_round}{rounds} rounds", "step", None
    description = f"round {progress.shown_round}{rounds} {phase}"
    return description, PHASE_UNITS.get(phase, "step"), _eta_text(progress.queue_eta())


def _eta_text(seconds: float | None) -> str | None:
    from comlrl_lab.engine import eta

    return None if seconds is None else eta.text(seconds)


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
    from comlrl_lab.engine.run import quiet_library_progress

    quiet_library_progress()

    manager = RunManager(args.runs_root)
    run_id = manager.open(args.resume) if args.resume else manager.create(spec)
    run = manager.run(run_id)
    print(f"run {run_id} in {run.run_dir}")
    manager.start(run_id, rounds=10**6)
    bar = tqdm(total=0, unit="step", dynamic_ncols=True, disable=args.quiet)
    shown: tuple | None = None
    try:
        while True:
            progress = manager.wait(run_id, timeout=0.5)
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
            if not progress.busy:
                break
    except KeyboardInterrupt:
        manager.stop(run_id)
        progress = manager.wait(run_id)
    finally:
        bar.close()
    progress = manager.progress(run_id)
    manager.close()
    if progress.status == "error":
        print(f"error: {progress.last_error}", file=sys.stderr)
        if args.verbose and progress.last_traceback:
            print(progress.last_traceback, file=sys.stderr)
        return 1
    if progress.next_phase is None:
        print(f"{progress.status}: {progress.num_rounds} of {progress.num_rounds} rounds, results in {run.run_dir}")
    else:
        where = f"round {progress.round_index} {progress.next_phase}"
        print(f"{progress.status}: next is {where}, results in {run.run_dir}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from comlrl_lab.engine.manager import RunManager
    from comlrl_lab.engine.run import quiet_library_progress
    from comlrl_lab.engine.sweep import Sweep, SweepRunner, parse_grid

    quiet_library_progress()

    try:
        if args.resume:
            if args.spec or args.grid:
                raise ValueError("--resume continues a sweep as it was made; give no SPEC or --grid with it")
            sweep = Sweep.open(args.resume)
        else:
            if not args.spec:
                raise ValueError("give a SPEC file or --resume SWEEP_DIR")
            spec = _load_spec(args)
            grid = parse_grid(spec.config_class, args.grid)
            sweep = Sweep.create(spec, grid, seeds=args.seeds, runs_root=args.runs_root, parallel=args.parallel or 1)
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
            eta = _eta_text(progress.eta_seconds)
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


def _export(args: argparse.Namespace) -> int:
    from comlrl_lab.data.reward_distribution import DISTRIBUTION_DIR
    from comlrl_lab.store import export_pairs, export_reward_distribution_files, export_round_files

    run_dir = Path(args.run_dir)
    with _export_source(run_dir) as store:
        run_id = args.run_id or store.first_run_id()
        if run_id is None:
            print(f"comlrl-lab export: {run_dir} holds no run", file=sys.stderr)
            return 1
        filters = {k: v for k, v in {"round": args.round, "winner_side": args.winner_side}.items() if v is not None}
        started = time.perf_counter()
        if args.format == ROUND_FILES:
            export_round_files(store, run_id, args.dest)
            export_reward_distribution_files(store, run_id, Path(args.dest) / DISTRIBUTION_DIR)
        else:
            export_pairs(store, run_id, args.format, args.dest, **filters)
    print(f"exported {args.format} to {args.dest} in {time.perf_counter() - started:.2f}s")
    return 0


def _import(args: argparse.Namespace) -> int:
    from comlrl_lab.data.run_ids import new_run_id
    from comlrl_lab.engine.run import STORE_FILE
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


_RUNS = os.environ.get(RUNS_DIR_ENV) or "runs"
_RUNS_HELP = f"the runs folder, where the workbench looks (default: ${RUNS_DIR_ENV}, else runs)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="comlrl-lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run an experiment spec (YAML or JSON) to the end, headless")
    run.add_argument("spec", nargs="?", help="experiment spec file (.yaml/.yml/.json)")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue a run directory after its last finished phase")
    run.add_argument("--runs-root", default=_RUNS, help=_RUNS_HELP)
    run.add_argument("--rounds", type=int, help="override num_iterations")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    run.add_argument("--verbose", action="store_true", help="print the traceback on error")
    run.set_defaults(func=_run)

    sweep = sub.add_parser("sweep", help="run a grid of experiments, each cell a run directory with the sweep's tag")
    sweep.add_argument("spec", nargs="?", help="base experiment spec file (.yaml/.yml/.json)")
    sweep.add_argument(
        "--grid", action="append", default=[], metavar="FIELD=V1,V2", help="a config field and its values (repeatable)"
    )
    sweep.add_argument("--seeds", type=int, default=1, help="seeds per grid point, counting up from the spec's seed")
    sweep.add_argument("--parallel", type=int, help="cells run at the same time (default: 1, or the sweep's own)")
    sweep.add_argument("--resume", metavar="SWEEP_DIR", help="finish the unfinished cells of a sweep")
    sweep.add_argument("--runs-root", default=_RUNS, help=_RUNS_HELP)
    sweep.add_argument("--rounds", type=int, help="override num_iterations")
    sweep.add_argument("--quiet", action="store_true", help="no progress bar")
    sweep.set_defaults(func=_sweep)

    export = sub.add_parser("export", help="export a run's pairs or round files")
    export.add_argument("run_dir")
    export.add_argument("--format", choices=list(EXPORT_FORMATS), default="jsonl")
    export.add_argument("--dest", required=True, help="file (pairs) or directory (rounds)")
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
    return parser


#: Exit status of a mistake in the command line, a spec, a config or a run directory (argparse's own is 2 too).
USAGE_ERROR = 2


def main(argv: list[str] | None = None) -> int:
    """Run one command. A mistake is one line on stderr, with exit status 2; ``--verbose`` adds the traceback."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
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
    text = " ".join(str(error).split()) or type(error).__name__
    export = sys.modules.get("comlrl_lab.store.export")
    plain = (ValueError, LookupError, FileNotFoundError, InvalidTransition) + ((export.ExportError,) if export else ())
    return text if isinstance(error, plain) else f"{type(error).__name__}: {text}"


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
