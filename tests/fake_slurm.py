"""A stand-in for Slurm's ``sbatch``, ``srun`` and ``squeue`` on one machine, for tests without a cluster.

``install(root, run_jobs=...)`` writes the three commands into ``root/bin`` (put it first on PATH). ``sbatch``
keeps each script it is given as ``root/scripts/<job id>.sh`` and answers "Submitted batch job <id>" (ids count
up from 4242). With ``run_jobs`` it also runs the job array as Slurm would on one node: each task of
``#SBATCH --array=0-K%P`` runs the script with Slurm's environment variables (SLURM_ARRAY_JOB_ID, ...), at most P
at a time, in a process group of its own, so nothing waits for the test; ``srun`` runs its command with its
``--output`` and ``--error`` patterns filled in. ``squeue`` lists the array tasks not yet ended, one per line
(``root/queued/<id>_<task>``; a test may write such files itself). Nothing else of Slurm is imitated: no
scheduling beyond %P, no signals, no requeue.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

FIRST_JOB_ID = 4242


def install(root: Path, *, run_jobs: bool) -> Path:
    """The fake commands in ``root/bin`` (returned), with their state under ``root``."""
    root = Path(root)
    for folder in ("bin", "scripts", "queued"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for name in ("sbatch", "srun", "squeue"):
        shim = root / "bin" / name
        shim.write_text(
            "#!/bin/sh\n"
            f"export FAKE_SLURM_ROOT='{root}' FAKE_SLURM_RUN={int(run_jobs)}\n"
            f"exec '{sys.executable}' '{Path(__file__).resolve()}' {name} \"$@\"\n"
        )
        shim.chmod(0o755)
    return root / "bin"


def queue(root: Path, *job_ids: str) -> None:
    """Make ``squeue`` list exactly ``job_ids``."""
    folder = Path(root) / "queued"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    for job_id in job_ids:
        (folder / job_id).touch()


def _sbatch(root: Path, args: list[str]) -> None:
    script = Path(args[-1])
    job_id = FIRST_JOB_ID + len(list((root / "scripts").iterdir()))
    kept = root / "scripts" / f"{job_id}.sh"
    shutil.copy(script, kept)
    print(f"Submitted batch job {job_id}")
    if os.environ.get("FAKE_SLURM_RUN") != "1":
        return
    array = re.search(r"^#SBATCH --array=0-(\d+)%(\d+)$", kept.read_text(), flags=re.M)
    last, parallel = (int(array.group(1)), int(array.group(2))) if array else (0, 1)
    for task in range(last + 1):
        (root / "queued" / f"{job_id}_{task}").touch()
    subprocess.Popen(
        [sys.executable, __file__, "run-array", str(job_id), str(kept), str(last), str(parallel)],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _run_array(root: Path, job_id: str, script: str, last: int, parallel: int) -> None:
    running: dict[int, subprocess.Popen] = {}
    pending = list(range(last + 1))
    while pending or running:
        while pending and len(running) < parallel:
            task = pending.pop(0)
            env = dict(
                os.environ,
                SLURM_JOB_ID=f"{job_id}{task:03d}",
                SLURM_ARRAY_JOB_ID=job_id,
                SLURM_ARRAY_TASK_ID=str(task),
                SLURM_NTASKS="1",
                SLURM_JOB_NUM_NODES="1",
                SLURM_NODEID="0",
                SLURM_PROCID="0",
                SLURM_LOCALID="0",
                SLURM_JOB_NODELIST="localhost",
            )
            running[task] = subprocess.Popen(["bash", script], env=env, stdin=subprocess.DEVNULL)
        for task, proc in list(running.items()):
            if proc.poll() is not None:
                (root / "queued" / f"{job_id}_{task}").unlink(missing_ok=True)
                del running[task]
        time.sleep(0.2)


def _srun(args: list[str]) -> None:
    outputs: dict[str, str] = {}
    while args and args[0].startswith("--"):
        flag = args.pop(0)
        if flag in ("--output", "--error"):
            outputs[flag] = args.pop(0)
    fill = {
        "%A": os.environ.get("SLURM_ARRAY_JOB_ID", ""),
        "%a": os.environ.get("SLURM_ARRAY_TASK_ID", ""),
        "%j": os.environ.get("SLURM_JOB_ID", ""),
        "%t": "0",
    }
    paths = {}
    for flag, pattern in outputs.items():
        for key, value in fill.items():
            pattern = pattern.replace(key, value)
        paths[flag] = pattern
    with open(paths.get("--output", os.devnull), "a") as out, open(paths.get("--error", os.devnull), "a") as err:
        raise SystemExit(subprocess.call(args, stdout=out, stderr=err))


def main(argv: list[str]) -> None:
    root = Path(os.environ.get("FAKE_SLURM_ROOT", "."))
    command, args = argv[0], argv[1:]
    if command == "sbatch":
        _sbatch(root, args)
    elif command == "run-array":
        _run_array(root, args[0], args[1], int(args[2]), int(args[3]))
    elif command == "srun":
        _srun(args)
    elif command == "squeue":
        print("\n".join(sorted(p.name for p in (root / "queued").iterdir())))


if __name__ == "__main__":
    main(sys.argv[1:])
