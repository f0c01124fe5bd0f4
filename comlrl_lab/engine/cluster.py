"""Sweep cells as cluster jobs through submitit: one job array per submission, each job owning its own cell.

``submit`` hands a sweep's cells to submitit as one job array (``map_array``: one task per cell) on Slurm
(``sbatch``) or, with the ``submitit-local`` launcher, as local processes, writes the job ids into the manifest and
returns: nothing has to stay alive after it. Each job runs ``CellJob``: it takes its cell's lock (a file lock held
for the job's life, so two jobs never run one cell and a dead job's cell is seen as such), reads the cell from the
manifest, creates or reopens the cell's run and steps it to its end (``torchrun`` over the job's GPUs when a run
has more than one), recording its state under the manifest's lock (``Sweep.editing``). When Slurm pre-empts the
job or its time runs out, submitit calls ``CellJob.checkpoint`` and requeues it; the new job resumes the run
after its last finished phase, as ``comlrl-lab run --resume`` does.

``cell_states`` tells each cell's state as the manifest has it, corrected by what can be checked (a running
cell whose lock is free, or a queued one whose job the scheduler has forgotten, is ``lost``); ``resumable``
picks what ``sweep --resume`` resubmits. submitit is imported only here, and only when a job is made or run.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from comlrl_lab.engine.run import Run
from comlrl_lab.engine.sweep import ACTIVE_STATES, Sweep, SweepCell

#: ``--launcher`` values: threads of this process (``SweepRunner``), a Slurm job array, local submitit processes.
LOCAL, SLURM, SUBMITIT_LOCAL = "local", "slurm", "submitit-local"
LAUNCHERS = (LOCAL, SLURM, SUBMITIT_LOCAL)
JOBS_DIR = "jobs"  # submitit's folder: submission scripts, pickled calls, each job's log
CELL_LOCKS_DIR = "cells"
SLOTS_DIR = "slots"
#: How long a starting job waits for its cell's lock (a status check holds it for a moment) before it concludes
#: that another job is running the cell and leaves.
CELL_LOCK_WAIT_S = 30.0
SLOT_POLL_S = 1.0
#: Requeues after a time-out before submitit gives a job up (pre-emptions do not count).
MAX_TIMEOUTS = 10
_MEM = re.compile(r"\d+[KMGT]?B?", re.IGNORECASE)
_SLURM_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


def time_minutes(text: str) -> int:
    """Slurm's time formats (``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``) in whole minutes, rounded up."""
    match = _SLURM_TIME.fullmatch(str(text).strip())
    if match is None:
        raise ValueError(f"--time must read MINUTES, HH:MM:SS or D-HH:MM:SS, got {text!r}")
    days, first, second, third = match.groups()
    if days is not None:
        seconds = int(days) * 86400 + int(first) * 3600 + int(second or 0) * 60 + int(third or 0)
    elif third is not None:
        seconds = int(first) * 3600 + int(second) * 60 + int(third)
    elif second is not None:
        seconds = int(first) * 60 + int(second)
    else:
        seconds = int(first) * 60
    if seconds <= 0:
        raise ValueError(f"--time must be positive, got {text!r}")
    return math.ceil(seconds / 60)


@dataclass
class ClusterOptions:
    """What each cell's job asks the scheduler for (the Slurm options of ``comlrl-lab sweep``)."""

    partition: str | None = field(default=None, metadata={"help": "Slurm partition (sbatch --partition)"})
    time: str = field(
        default="4:00:00",
        metadata={"help": "time limit per job, in Slurm's formats; a job that runs out is requeued and resumes"},
    )
    gpus_per_run: int = field(
        default=1, metadata={"help": "GPUs per cell; more than one runs the cell under torchrun, one rank per GPU"}
    )
    cpus_per_run: int | None = field(default=None, metadata={"help": "CPU cores per cell (sbatch --cpus-per-task)"})
    mem: str | None = field(default=None, metadata={"help": "memory per cell, e.g. 64G (sbatch --mem)"})
    array_parallelism: int | None = field(
        default=None, metadata={"help": "cells running at once (the job array's %%N); all of them when unset"}
    )
    extra: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "any other sbatch option, KEY=VALUE (a bare KEY is a flag)"}
    )

    def __post_init__(self) -> None:
        time_minutes(self.time)
        for name in ("gpus_per_run", "cpus_per_run", "array_parallelism"):
            value = getattr(self, name)
            lowest = 0 if name == "gpus_per_run" else 1
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < lowest):
                raise ValueError(f"--{name.replace('_', '-')} must be an integer >= {lowest}, got {value!r}")
        if self.mem is not None and not _MEM.fullmatch(str(self.mem)):
            raise ValueError(f"--mem must read like 64G or 16000M, got {self.mem!r}")

    def launcher(self, kind: str) -> dict[str, Any]:
        """The manifest's record of how the sweep's cells run (``Sweep.launcher``)."""
        return {"kind": kind, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterOptions:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def parse_extra(entries: list[str]) -> dict[str, Any]:
    """``["account=proj", "exclusive"]`` -> ``{"account": "proj", "exclusive": True}`` (sbatch option names)."""
    extra: dict[str, Any] = {}
    for entry in entries:
        key, sep, value = entry.partition("=")
        key = key.strip().lstrip("-")
        if not key or (sep and not value.strip()):
            raise ValueError(f"--slurm-extra must read KEY=VALUE or KEY, got {entry!r}")
        extra[key] = value.strip() if sep else True
    return extra


def check_available(kind: str) -> None:
    """Raise a one-line ValueError when ``kind`` cannot submit from here (submitit missing, no Slurm commands)."""
    if kind not in LAUNCHERS:
        raise ValueError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {kind!r}")
    if kind == LOCAL:
        return
    try:
        import submitit  # noqa: F401
    except ImportError:
        raise ValueError(f"--launcher {kind} needs submitit: pip install 'comlrl-lab[slurm]'") from None
    if kind == SLURM and not slurm_commands():
        raise ValueError("--launcher slurm needs Slurm's sbatch and srun on PATH (run it on the cluster's login node)")


def slurm_commands() -> bool:
    """Whether Slurm's submission commands are here (submitit's Slurm executor runs each job under srun)."""
    return shutil.which("sbatch") is not None and shutil.which("srun") is not None


def slurm_available() -> bool:
    """Whether ``--launcher slurm`` can submit from this machine: submitit is installed and Slurm's commands are here."""
    try:
        check_available(SLURM)
    except ValueError:
        return False
    return True


# Submitting ------------------------------------------------------------------------------------------------------
def _executor(sweep: Sweep, kind: str, options: ClusterOptions) -> Any:
    import submitit

    executor = submitit.AutoExecutor(
        folder=sweep.sweep_dir / JOBS_DIR,
        cluster="slurm" if kind == SLURM else "local",
        slurm_max_num_timeout=MAX_TIMEOUTS,
        local_max_num_timeout=MAX_TIMEOUTS,
    )
    executor.update_parameters(
        name=f"comlrl-{sweep.sweep_id}",
        timeout_min=time_minutes(options.time),
        # One task per cell: torchrun, not Slurm, starts a run's ranks, so a run resumes with any number of GPUs.
        tasks_per_node=1,
        nodes=1,
        gpus_per_node=options.gpus_per_run or None,
        cpus_per_task=options.cpus_per_run,
        slurm_partition=options.partition,
        slurm_mem=options.mem,
        slurm_array_parallelism=options.array_parallelism,
        slurm_additional_parameters=dict(options.extra) or None,
    )
    return executor


def submit(sweep: Sweep, cells: list[SweepCell], kind: str, options: ClusterOptions) -> list[str]:
    """Submit ``cells`` as one job array (one task per cell); returns the job ids, also written into the manifest.

    The cells are marked ``submitted`` before the array goes out, so a job that starts at once finds its cell
    waiting for it; a refused submission marks them ``error`` with the scheduler's message and raises.
    """
    check_available(kind)
    indices = [cell.index for cell in cells]
    sweep.launcher = options.launcher(kind)
    with sweep.editing() as now:
        for index in indices:
            now[index].status, now[index].error, now[index].job_id = "submitted", None, None
    executor = _executor(sweep, kind, options)
    job = CellJob(
        str(sweep.sweep_dir),
        processes=max(1, options.gpus_per_run),
        # Slurm's array runs at most N tasks at once; local processes all start and wait for one of N slots.
        slots=options.array_parallelism if kind == SUBMITIT_LOCAL else None,
    )
    try:
        jobs = executor.map_array(job, indices)
    except Exception as error:
        with sweep.editing() as now:
            for index in indices:
                now[index].status, now[index].error = "error", f"submission failed: {error}"
        raise
    with sweep.editing() as now:
        for index, submitted in zip(indices, jobs, strict=True):
            now[index].job_id = str(submitted.job_id)
    return [str(j.job_id) for j in jobs]


# Where each cell stands ------------------------------------------------------------------------------------------
def cell_lock(sweep_dir: Path, index: int) -> FileLock:
    """The lock a job holds while it owns cell ``index``; the operating system frees it when the job dies."""
    folder = Path(sweep_dir) / CELL_LOCKS_DIR
    folder.mkdir(exist_ok=True)
    return FileLock(folder / f"cell-{index:04d}.lock")


def _held(sweep_dir: Path, index: int) -> bool:
    lock = cell_lock(sweep_dir, index)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return True
    lock.release()
    return False


def queued_jobs(kind: str, job_ids: list[str]) -> set[str]:
    """Those of ``job_ids`` that the scheduler still holds (pending, running or requeued)."""
    if not job_ids:
        return set()
    if kind == SUBMITIT_LOCAL:  # a local job id is its controller's process id
        return {j for j in job_ids if _process_alive(int(j))}
    arrays = sorted({j.split("_")[0] for j in job_ids})
    # --array lists each array task on its own line (12345_3), pending ones too.
    command = ["squeue", "--noheader", "--array", "--format=%i", f"--jobs={','.join(arrays)}"]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise RuntimeError(f"could not ask Slurm which jobs are queued ({' '.join(command)}): {error}") from None
    if result.returncode != 0:
        if "invalid job id" in result.stderr.lower():  # every job has left the queue and Slurm forgot them
            return set()
        raise RuntimeError(f"{' '.join(command)} failed: {result.stderr.strip()}")
    listed = set(result.stdout.split())
    return {j for j in job_ids if j in listed}


def _process_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"  # an exited child not yet reaped is a zombie


def cell_states(sweep: Sweep, *, strict: bool = True) -> list[str]:
    """Each cell's state: the manifest's, except that work whose job has died is ``lost``.

    When the scheduler cannot be asked, ``strict`` raises RuntimeError; otherwise queued cells keep the manifest's
    state (a page that polls must not fail because squeue did once).
    """
    kind = sweep.launcher.get("kind", LOCAL)
    states = [cell.status for cell in sweep.cells]
    if kind == LOCAL:
        # The local runner holds a running cell's lock; a cell still "running" in the manifest whose lock is free
        # was running in a process that is gone (killed): lost, as a dead job's cell.
        return [
            "lost" if state == "running" and not _held(sweep.sweep_dir, cell.index) else state
            for cell, state in zip(sweep.cells, states, strict=True)
        ]
    waiting = [c.job_id for c in sweep.cells if c.status in ("submitted", "requeued") and c.job_id]
    try:
        queued = queued_jobs(kind, waiting)
    except RuntimeError:
        if strict:
            raise
        queued = set(waiting)
    for i, cell in enumerate(sweep.cells):
        if cell.status == "running" and not _held(sweep.sweep_dir, cell.index):
            states[i] = "lost"
        elif cell.status in ("submitted", "requeued") and cell.job_id and cell.job_id not in queued:
            # Left the queue: it is running now (it holds the lock), or it died before it could say so.
            states[i] = "running" if _held(sweep.sweep_dir, cell.index) else "lost"
    return states


def refuse_while_jobs_run(sweep: Sweep) -> None:
    """Raise ValueError when a cell still has a job queued or running (a local resume must not run it too)."""
    active = [c.index for c, s in zip(sweep.cells, cell_states(sweep), strict=True) if s in ACTIVE_STATES]
    if active:
        raise ValueError(f"cells {active} still have cluster jobs queued or running; wait for them or cancel them")


def resumable(sweep: Sweep) -> list[SweepCell]:
    """The cells ``sweep --resume`` submits again: failed, stopped, lost or never started."""
    states = cell_states(sweep)
    return [c for c, s in zip(sweep.cells, states, strict=True) if s in ("pending", "error", "stopped", "lost")]


# The job ---------------------------------------------------------------------------------------------------------
class CellJob:
    """The callable each array task runs, ``CellJob(...)(index)``; submitit pickles it for the job."""

    def __init__(self, sweep_dir: str, *, processes: int = 1, slots: int | None = None):
        self.sweep_dir = sweep_dir
        self.processes = processes
        self.slots = slots

    def __call__(self, index: int) -> str:
        return run_cell(Path(self.sweep_dir), index, processes=self.processes, slots=self.slots)

    def checkpoint(self, index: int) -> Any:
        """submitit's hook on pre-emption or time-out: mark the cell requeued and run the same call again.

        Nothing needs saving here: the run's checkpoint after its last finished phase is the resume point.
        """
        from submitit.helpers import DelayedSubmission

        _REQUEUED.set()
        # This runs in a signal handler, maybe while the interrupted code holds the manifest's lock: wait briefly.
        with contextlib.suppress(Exception), Sweep.open(self.sweep_dir).editing(timeout=5) as cells:
            cells[index].status = "requeued"
        return DelayedSubmission(self, index)


#: Set once submitit has called ``checkpoint`` in this process: the job is being requeued and must exit.
_REQUEUED = threading.Event()


def _requeue_exit(error: BaseException) -> None:
    """Exit as submitit's requeue meant to, when native code turned its exit into another error (DuckDB answers a
    signal that arrives mid-query with "Query interrupted", and the local executor restarts only on its exit code)."""
    if _REQUEUED.is_set() and not isinstance(error, SystemExit):
        from submitit.local.local import LOCAL_REQUEUE_RETURN_CODE

        local = os.environ.get("SUBMITIT_EXECUTOR") == "local"
        raise SystemExit(LOCAL_REQUEUE_RETURN_CODE if local else -1) from error


def _job_id() -> str | None:
    import submitit

    try:
        return str(submitit.JobEnvironment().job_id)
    except RuntimeError:  # not inside a submitit job (called directly)
        return None


@contextlib.contextmanager
def _slot(sweep_dir: Path, slots: int) -> Iterator[None]:
    """One of ``slots`` places to run, for local processes that all start at once."""
    folder = sweep_dir / SLOTS_DIR
    folder.mkdir(exist_ok=True)
    locks = [FileLock(folder / f"slot-{i}.lock") for i in range(slots)]
    while True:
        for lock in locks:
            try:
                lock.acquire(timeout=0)
            except Timeout:
                continue
            try:
                yield
            finally:
                lock.release()
            return
        time.sleep(SLOT_POLL_S)


def run_cell(sweep_dir: Path, index: int, *, processes: int = 1, slots: int | None = None) -> str:
    """Run (or resume) cell ``index`` of the sweep in ``sweep_dir`` to its end; returns what happened, in words."""
    lock = cell_lock(sweep_dir, index)
    try:
        lock.acquire(timeout=CELL_LOCK_WAIT_S)
    except Timeout:
        return f"cell {index} is run by another job; nothing to do"
    try:
        with contextlib.ExitStack() as stack:
            if slots:
                stack.enter_context(_slot(sweep_dir, slots))
            sweep = Sweep.open(sweep_dir)
            with sweep.editing() as cells:
                cell = cells[index]
                if cell.status == "finished":
                    return f"cell {index} has finished already"
                cell.status, cell.error, cell.attempts = "running", None, cell.attempts + 1
                cell.job_id = _job_id() or cell.job_id
            try:
                _step_to_end(sweep, index, processes)
            except BaseException as error:
                with contextlib.suppress(Exception), sweep.editing() as cells:
                    # A requeue (SystemExit from submitit's signal handler) has marked the cell already.
                    if cells[index].status == "running":
                        cells[index].status, cells[index].error = "error", f"{type(error).__name__}: {error}"
                _requeue_exit(error)
                raise
            with sweep.editing() as cells:
                cells[index].status = "finished"
            return f"cell {index} finished"
    finally:
        lock.release()


def _step_to_end(sweep: Sweep, index: int, processes: int) -> None:
    cell = sweep.cells[index]
    if cell.run_id is not None and (sweep.runs_root / cell.run_id).is_dir():
        run = Run.open(sweep.runs_root / cell.run_id)
    else:
        run = Run.create(sweep.cell_spec(cell), sweep.runs_root)
        with sweep.editing() as cells:
            cells[index].run_id = run.run_id
    try:
        if processes > 1:
            run.close()  # rank 0 of torchrun opens the store; DuckDB lets one process hold it
            _torchrun(run.run_dir, processes)
            return
        while run.cursor()[1] is not None:
            run.step()
    finally:
        run.close()


def _torchrun(run_dir: Path, processes: int) -> None:
    """Resume ``run_dir`` data parallel over ``processes`` ranks on this node (the distributed path of ``run``)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        "-m",
        "comlrl_lab.cli",
        "run",
        "--resume",
        str(run_dir),
        "--quiet",
    ]
    # The job's own rank variables (Slurm's, submitit's) must not leak into torchrun's ranks.
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    result = subprocess.run(command, env=env, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"torchrun over {processes} ranks exited with status {result.returncode}")
