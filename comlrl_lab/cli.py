"""Headless entry point: ``comlrl-lab run SPEC``, ``sweep SPEC --grid F=V1,V2``, ``export RUN_DIR``, ``import DIR``.

``run`` drives the same engine as the workbench, in the foreground, with a progress bar. A run directory can
be resumed with ``comlrl-lab run --resume RUN_DIR`` after a crash or a kill; it continues after the last
finished phase. Started by ``torchrun --nproc_per_node=K -m comlrl_lab.cli run SPEC`` (or the ``comlrl-lab``
script under torchrun), ``run`` becomes data parallel: rank 0 owns the run directory and the store, every rank
collects and trains its share, and a run resumes with any K.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import time
import traceback
from pathlib import Path

import duckdb

from comlrl_lab.data.reward_distribution import DISTRIBUTION_DIR
from comlrl_lab.engine import ExperimentSpec, InvalidTransition, RunManager
from comlrl_lab.engine.run import STORE_FILE, run_data_parallel
from comlrl_lab.store import RunStore
from comlrl_lab.store.export import (
    ExportError,
    export_pairs,
    export_reward_distribution_files,
    export_round_files,
)
from comlrl_lab.store.formats import EXPORT_FORMATS, ROUND_FILES
from comlrl_lab.store.importer import import_replay_dir
from comlrl_lab.trainers.preference.distributed import DistContext


def _run_ranks(args: argparse.Namespace, dist: DistContext) -> int:
    """``run`` under torchrun: every rank steps the run in the foreground; rank 0 prints."""
    spec = None
    if not args.resume:
        if not args.spec:
            print("comlrl-lab run: give a SPEC file or --resume RUN_DIR", file=sys.stderr)
            return 2
        spec = ExperimentSpec.load(args.spec)
        if args.rounds is not None:
            spec.config["num_iterations"] = args.rounds
    quiet = args.quiet or not dist.is_main
    run = run_data_parallel(
        dist, spec=spec, resume=args.resume, runs_root=args.runs_root, log=(lambda _line: None) if quiet else print
    )
    if dist.is_main:
        print(f"finished: {dist.world_size} ranks, results in {run.run_dir}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    dist = DistContext.from_env()
    if dist.enabled:
        return _run_ranks(args, dist)
    manager = RunManager(args.runs_root)
    if args.resume:
        run_id = manager.open(args.resume)
    else:
        if not args.spec:
            print("comlrl-lab run: give a SPEC file or --resume RUN_DIR", file=sys.stderr)
            return 2
        spec = ExperimentSpec.load(args.spec)
        if args.rounds is not None:
            spec.config["num_iterations"] = args.rounds
        run_id = manager.create(spec)
    run = manager.run(run_id)
    print(f"run {run_id} in {run.run_dir}")
    manager.start(run_id, rounds=10**6)
    bar = tqdm(total=0, unit="step", dynamic_ncols=True, disable=args.quiet)
    try:
        while True:
            progress = manager.wait(run_id, timeout=0.5)
            bar.total = progress.total
            bar.n = progress.done
            bar.set_description(f"round {progress.round_index} {progress.phase or progress.next_phase or 'done'}")
            bar.set_postfix(tok_s=f"{progress.tokens_per_second:.0f}")
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
    print(f"{progress.status}: round {progress.round_index}, results in {run.run_dir}")
    return 0


def _sweep(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from comlrl_lab.engine.sweep import Sweep, SweepRunner, parse_grid

    try:
        if args.resume:
            if args.spec or args.grid:
                raise ValueError("--resume continues a sweep as it was made; give no SPEC or --grid with it")
            sweep = Sweep.open(args.resume)
        else:
            if not args.spec:
                raise ValueError("give a SPEC file or --resume SWEEP_DIR")
            spec = ExperimentSpec.load(args.spec)
            if args.rounds is not None:
                spec.config["num_iterations"] = args.rounds
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


def _export(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    with RunStore(run_dir / STORE_FILE, read_only=True) as store:
        run_id = args.run_id or store.first_run_id()
        if run_id is None:
            print(f"comlrl-lab export: {run_dir / STORE_FILE} holds no run", file=sys.stderr)
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
    with RunStore(args.store) as store:
        report = import_replay_dir(store, args.directory, run_id=args.run_id)
    print(f"imported {report.pairs} pairs from {len(report.imported_files)} files")
    for name, reason in report.skipped:
        print(f"skipped {name}: {reason}", file=sys.stderr)
    for name, reason in report.ignored:
        print(f"ignored {name}: {reason}", file=sys.stderr)
    return 0 if report.imported_files or not report.skipped else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="comlrl-lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run an experiment spec (YAML or JSON) to the end, headless")
    run.add_argument("spec", nargs="?", help="experiment spec file (.yaml/.yml/.json)")
    run.add_argument("--resume", metavar="RUN_DIR", help="continue a run directory after its last finished phase")
    run.add_argument("--runs-root", default="runs", help="where new run directories are created (default: runs)")
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
    sweep.add_argument("--runs-root", default="runs", help="where cell run directories are created (default: runs)")
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

    imp = sub.add_parser("import", help="import a CoMLRL preference_replay directory into a DuckDB file")
    imp.add_argument("directory")
    imp.add_argument("--store", required=True, help="DuckDB file to import into (created if missing)")
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
    if isinstance(error, duckdb.IOException) and "lock" in str(error).lower():
        return _lock_holder(str(error))
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        return f"{error.filename}: {error.strerror}"
    text = " ".join(str(error).split()) or type(error).__name__
    plain = (ValueError, LookupError, FileNotFoundError, InvalidTransition, ExportError)
    return text if isinstance(error, plain) else f"{type(error).__name__}: {text}"


def _lock_holder(message: str) -> str:
    """DuckDB's lock conflict as: which file, which process holds it, and its command line when readable."""
    path = re.search(r'file "([^"]+)"', message)
    pid = re.search(r"PID (\d+)", message)
    where = path.group(1) if path else "the store"
    if pid is None:
        return f"{where} is open in another process; close that process first ({message.splitlines()[0]})"
    holder = f"process {pid.group(1)}"
    with contextlib.suppress(OSError):
        command = Path(f"/proc/{pid.group(1)}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        command = " ".join(command.split())
        if command:
            holder += f" ({command[:160]})"
    return f"{where} is held by {holder}; stop it, or wait for it to finish, then try again"


if __name__ == "__main__":
    raise SystemExit(main())
