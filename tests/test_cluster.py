"""Sweeps on a cluster: the sbatch script submitit writes, job ids in the manifest, status, resume, the manifest's
lock under many processes, and (slow) whole grids through submitit's local executor, with a job killed or requeued
halfway.

No Slurm here: ``fake_slurm.py``'s ``sbatch``, ``srun`` and ``squeue`` on PATH stand in for its commands (they record
what they are given and answer as Slurm does, and can run a job array on this machine), and submitit's local
executor runs the very job functions a cluster would run, as processes of this machine.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shlex
import signal
import sys
import time
from pathlib import Path

import fake_slurm as fake_slurm_commands
import pytest
from test_sweep import tiny_spec

from comlrl_lab.cli import main
from comlrl_lab.engine import cluster
from comlrl_lab.engine.cluster import ClusterOptions, parse_extra, time_minutes
from comlrl_lab.engine.sweep import SWEEPS_DIR, Sweep
from comlrl_lab.store import RunStore


# Options --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "minutes"),
    [("90", 90), ("1:30", 2), ("2:30:00", 150), ("1-00:00:00", 1440), ("1-2", 1560), ("0-0:45", 45), ("0:59", 1)],
)
def test_slurm_time_formats_in_whole_minutes(text, minutes):
    assert time_minutes(text) == minutes


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"time": "4h"}, "--time must read MINUTES, HH:MM:SS or D-HH:MM:SS, got '4h'"),
        ({"time": "0"}, "--time must be positive"),
        ({"gpus_per_run": -1}, "--gpus-per-run must be an integer >= 0, got -1"),
        ({"array_parallelism": 0}, "--array-parallelism must be an integer >= 1, got 0"),
        ({"mem": "lots"}, "--mem must read like 64G or 16000M, got 'lots'"),
    ],
)
def test_bad_cluster_options_are_refused_with_one_line(options, message):
    with pytest.raises(ValueError, match="^" + __import__("re").escape(message)):
        ClusterOptions(**options)


def test_slurm_extra_reads_key_value_and_bare_flags():
    assert parse_extra(["account=proj42", "--qos=high", "exclusive"]) == {
        "account": "proj42",
        "qos": "high",
        "exclusive": True,
    }
    with pytest.raises(ValueError, match="--slurm-extra must read KEY=VALUE or KEY, got 'account='"):
        parse_extra(["account="])


# A fake Slurm ---------------------------------------------------------------------------------------------------
@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """Slurm's commands as ``tests/fake_slurm.py`` imitates them, recording only: sbatch keeps each script in
    ``scripts/`` and answers job 4242, then 4243, ...; squeue lists what ``queue`` says; no job runs."""
    root = tmp_path / "slurm"
    monkeypatch.setenv("PATH", f"{fake_slurm_commands.install(root, run_jobs=False)}{os.pathsep}{os.environ['PATH']}")
    return {"root": root, "scripts": root / "scripts"}


def _spec_file(model_dir, tmp_path, **config) -> Path:
    path = tmp_path / "spec.json"
    tiny_spec(model_dir, **config).save(path)
    return path


def _only_sweep(runs: Path) -> Sweep:
    (sweep_dir,) = (runs / SWEEPS_DIR).iterdir()
    return Sweep.open(sweep_dir)


def _submitted_calls(sweep: Sweep, job_ids: list[str]) -> list:
    from submitit.core.utils import DelayedSubmission

    return [DelayedSubmission.load(sweep.sweep_dir / "jobs" / f"{j}_submitted.pkl") for j in job_ids]


def test_slurm_launcher_submits_one_array_with_the_options_given_and_returns(model_dir, tmp_path, fake_slurm, capsys):
    runs = tmp_path / "runs"
    code = main(
        [
            "sweep",
            str(_spec_file(model_dir, tmp_path)),
            "--grid",
            "preference_replay_mode=current,all_history",
            "--seeds",
            "2",
            "--runs-root",
            str(runs),
            "--launcher",
            "slurm",
            "--partition",
            "gpu",
            "--time",
            "2:30:00",
            "--gpus-per-run",
            "2",
            "--cpus-per-run",
            "8",
            "--mem",
            "64G",
            "--array-parallelism",
            "3",
            "--slurm-extra",
            "account=proj42",
            "--slurm-extra",
            "qos=high",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    sweep = _only_sweep(runs)
    assert "submitted 4 of 4 cells (slurm), jobs 4242_0, 4242_1, 4242_2, 4242_3" in out
    assert [(c.status, c.job_id, c.run_id) for c in sweep.cells] == [("submitted", f"4242_{i}", None) for i in range(4)]
    assert sweep.launcher == {
        "kind": "slurm",
        "partition": "gpu",
        "time": "2:30:00",
        "gpus_per_run": 2,
        "cpus_per_run": 8,
        "mem": "64G",
        "array_parallelism": 3,
        "extra": {"account": "proj42", "qos": "high"},
    }
    (script,) = fake_slurm["scripts"].iterdir()
    jobs = sweep.sweep_dir / "jobs"
    lines = script.read_text().splitlines()
    assert [line for line in lines if line.startswith("#SBATCH")] == [
        "#SBATCH --account=proj42",
        "#SBATCH --array=0-3%3",
        "#SBATCH --cpus-per-task=8",
        f"#SBATCH --error={jobs}/%A_%a_0_log.err",
        "#SBATCH --gpus-per-node=2",
        f"#SBATCH --job-name=comlrl-{sweep.sweep_id}",
        "#SBATCH --mem=64G",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={jobs}/%A_%a_0_log.out",
        "#SBATCH --partition=gpu",
        "#SBATCH --qos=high",
        "#SBATCH --signal=USR2@90",
        "#SBATCH --time=150",
        "#SBATCH --wckey=submitit",
    ]
    assert lines[-2:] == [
        "export SUBMITIT_EXECUTOR=slurm",
        f"srun --unbuffered --output {jobs}/%A_%a_%t_log.out --error {jobs}/%A_%a_%t_log.err "
        f"{shlex.quote(sys.executable)} -u -m submitit.core._submit {jobs}",
    ]
    # Each array task calls the same job with its own cell; a cell of two GPUs runs under torchrun (2 processes).
    calls = _submitted_calls(sweep, [c.job_id for c in sweep.cells])
    assert [call.args for call in calls] == [(0,), (1,), (2,), (3,)]
    assert all(isinstance(call.function, cluster.CellJob) for call in calls)
    assert {(call.function.sweep_dir, call.function.processes, call.function.slots) for call in calls} == {
        (str(sweep.sweep_dir), 2, None)
    }
    assert not any(runs.glob("*/spec.json"))  # nothing ran here: the jobs create the runs


def test_status_shows_each_cell_and_resume_resubmits_only_failed_lost_and_never_started_cells(
    model_dir, tmp_path, fake_slurm, capsys
):
    runs = tmp_path / "runs"
    sweep = Sweep.create(
        tiny_spec(model_dir), {"dpo_beta": [0.1]}, seeds=7, runs_root=runs, launcher={"kind": "slurm", "time": "30"}
    )
    states = ["finished", "error", "pending", "submitted", "submitted", "running", "running"]
    with sweep.editing() as cells:
        for cell, status in zip(cells, states, strict=True):
            cell.status = status
            cell.job_id = None if status == "pending" else f"4000_{cell.index}"
        cells[1].error = "RuntimeError: CUDA out of memory"
    fake_slurm_commands.queue(fake_slurm["root"], "4000_3")  # cell 4's job left the queue without starting its cell
    held = cluster.cell_lock(sweep.sweep_dir, 6)  # cell 6's job is alive; cell 5's died
    held.acquire()
    try:
        assert main(["sweep", "status", str(sweep.sweep_dir)]) == 0
        out = capsys.readouterr().out.splitlines()
        assert (
            out[0]
            == f"sweep {sweep.sweep_id} (slurm): 7 cells, 1 finished, 1 running, 1 submitted, 1 pending, 2 lost, 1 error"
        )
        table = [line.split()[:5] for line in out[2:]]
        assert table == [
            ["0", "finished", "4000_0", "1/1", "4/4"],
            ["1", "error", "4000_1", "0/1", "0/4"],
            ["2", "pending", "-", "0/1", "0/4"],
            ["3", "submitted", "4000_3", "0/1", "0/4"],
            ["4", "lost", "4000_4", "0/1", "0/4"],
            ["5", "lost", "4000_5", "0/1", "0/4"],
            ["6", "running", "4000_6", "0/1", "0/4"],
        ]
        assert main(["sweep", "--resume", str(sweep.sweep_dir)]) == 0  # the sweep's own launcher: slurm
        assert "submitted 4 of 7 cells (slurm), jobs 4242_0, 4242_1, 4242_2, 4242_3" in capsys.readouterr().out
    finally:
        held.release()
    resumed = Sweep.open(sweep.sweep_dir)
    assert [(c.status, c.job_id) for c in resumed.cells] == [
        ("finished", "4000_0"),
        ("submitted", "4242_0"),
        ("submitted", "4242_1"),
        ("submitted", "4000_3"),
        ("submitted", "4242_2"),
        ("submitted", "4242_3"),
        ("running", "4000_6"),
    ]
    assert [call.args for call in _submitted_calls(resumed, [f"4242_{i}" for i in range(4)])] == [
        (1,),
        (2,),
        (4,),
        (5,),
    ]
    (script,) = fake_slurm["scripts"].iterdir()
    assert "#SBATCH --array=0-3%4" in script.read_text() and "#SBATCH --time=30" in script.read_text()
    # A local resume would run cells that jobs still hold: refused, nothing changes.
    assert main(["sweep", "--resume", str(sweep.sweep_dir), "--launcher", "local"]) == 2
    assert "still have cluster jobs queued or running" in capsys.readouterr().err


def test_launcher_errors_are_one_line_before_anything_is_written(model_dir, tmp_path, capsys, monkeypatch):
    runs = tmp_path / "runs"
    spec = str(_spec_file(model_dir, tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch, no srun
    base = ["sweep", spec, "--grid", "dpo_beta=0.1,0.2", "--runs-root", str(runs)]
    assert main([*base, "--launcher", "slurm"]) == 2
    assert capsys.readouterr().err.strip() == (
        "comlrl-lab sweep: --launcher slurm needs Slurm's sbatch and srun on PATH (run it on the cluster's login node)"
    )
    assert main([*base, "--partition", "gpu"]) == 2
    assert "--partition apply to a cluster launcher: add --launcher slurm" in capsys.readouterr().err
    assert main([*base, "--launcher", "submitit-local", "--parallel", "2"]) == 2
    assert "--parallel is for --launcher local" in capsys.readouterr().err
    assert main([*base, "--launcher", "submitit-local", "--time", "soon"]) == 2
    assert "--time must read MINUTES" in capsys.readouterr().err
    assert not runs.exists()


# The manifest's lock ---------------------------------------------------------------------------------------------
EDITS = 25


def _edit_own_cell(sweep_dir: str, index: int, barrier) -> None:
    sweep = Sweep.open(sweep_dir)
    barrier.wait()
    for _ in range(EDITS):
        with sweep.editing() as cells:
            cells[index].attempts += 1
    with sweep.editing() as cells:
        cells[index].status = "finished"


def test_jobs_finishing_at_once_each_keep_their_change_to_the_manifest(model_dir, tmp_path):
    """Eight processes change their own cell 26 times each, all at once: every change survives."""
    sweep = Sweep.create(tiny_spec(model_dir), {"dpo_beta": [0.1, 0.2]}, seeds=4, runs_root=tmp_path)
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(len(sweep.cells))
    workers = [
        context.Process(target=_edit_own_cell, args=(str(sweep.sweep_dir), c.index, barrier)) for c in sweep.cells
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert [w.exitcode for w in workers] == [0] * 8
    final = Sweep.open(sweep.sweep_dir)
    assert [(c.attempts, c.status) for c in final.cells] == [(EDITS, "finished")] * 8
    assert final.progress().finished == 8


# Whole grids through submitit's local executor (slow) ------------------------------------------------------------
def _task_pid(job_id: str) -> int:
    """The process that runs the job's function: the one child of submitit's local controller (the job id)."""
    children = Path(f"/proc/{job_id}/task/{job_id}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def _wait(condition, timeout: float, what: str, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _commits(sweep: Sweep) -> dict[int, dict[str, str]]:
    """Each cell's committed phases and their commit times, from its run's snapshot manifest."""
    out = {}
    for cell in sweep.cells:
        path = sweep.runs_root / cell.run_id / "snapshots" / "_manifest.json" if cell.run_id else None
        out[cell.index] = json.loads(path.read_text())["phases"] if path and path.exists() else {}
    return out


def _finished(sweep_dir: Path) -> bool:
    return all(c.status == "finished" for c in Sweep.open(sweep_dir).cells)


def _checkpointed_phases(run_dir: Path) -> int:
    """Phases finished before the newest committed checkpoint of a run (0 without one)."""
    from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt

    newest = ckpt.latest_checkpoint(run_dir / "checkpoint")
    if newest is None:
        return 0
    state = ckpt.read_state(newest)
    return (int(state["round_index"]) - 1) * 4 + int(state["phase_index"])


def _pairs_spec(model_dir):
    """Two quick rounds on the built-in length_ratio task, whose rewards rarely tie, so every round has pairs."""
    spec = tiny_spec(model_dir, num_iterations=2, max_new_tokens=6)
    spec.task, spec.user_task, spec.user_train_data, spec.user_eval_data = "length_ratio", None, None, None
    spec.max_train_items = 4
    return spec


def _pairs(run_dir: Path) -> list[tuple]:
    with RunStore(run_dir / "run.duckdb", read_only=True) as store:
        return (
            store.cursor()
            .execute(
                "SELECT round, pair_index, item_index, winner_completions, loser_completions, reward_gap FROM pairs "
                "ORDER BY round, pair_index"
            )
            .fetchall()
        )


@pytest.mark.slow
def test_a_2x2_grid_through_the_local_executor_resumes_a_killed_job_without_running_anything_twice(
    model_dir, tmp_path, capsys
):
    runs = tmp_path / "runs"
    spec = tmp_path / "spec.json"
    _pairs_spec(model_dir).save(spec)
    spec = str(spec)
    # Two modes by two seeds, two jobs at a time (test_sweep checks how a grid of several fields expands): every
    # cell is a process of its own, and its start is most of what a cell of two tiny rounds costs.
    grid = ["--grid", "preference_replay_mode=current,all_history"]
    launcher = ["--launcher", "submitit-local", "--array-parallelism", "2", "--gpus-per-run", "0", "--time", "30"]
    assert main(["sweep", spec, *grid, "--seeds", "2", "--runs-root", str(runs), *launcher]) == 0
    sweep = _only_sweep(runs)
    assert len(sweep.cells) == 4 and "submitted 4 of 4 cells (submitit-local)" in capsys.readouterr().out

    # Kill the job of the first cell seen halfway: round 1 committed with its pairs and checkpointed, round 2 not
    # finished. A kill in the moment between a phase's commit and its checkpoint (written in the background) would
    # redo that phase on resume, with the same rows: the one place where a phase can run twice.
    def halfway():
        now = Sweep.open(sweep.sweep_dir)
        commits = _commits(now)
        return next(
            (
                c
                for c in now.cells
                if c.status == "running"
                and 4 <= len(commits[c.index]) < 8
                and (runs / c.run_id / "snapshots" / "pairs" / "round_0001_collect.parquet").exists()
                and _checkpointed_phases(runs / c.run_id) >= len(commits[c.index])
            ),
            None,
        )

    victim = _wait(halfway, 600, "a cell halfway through its run")
    os.kill(_task_pid(victim.job_id), signal.SIGKILL)
    _wait(
        lambda: all(c.status == "finished" for c in Sweep.open(sweep.sweep_dir).cells if c.index != victim.index),
        900,
        "the other cells",
    )
    before = Sweep.open(sweep.sweep_dir)
    commits_before = _commits(before)
    pairs_before = _pairs(runs / victim.run_id)
    assert 4 <= len(commits_before[victim.index]) < 8 and len(pairs_before) > 0
    states = cluster.cell_states(before)
    assert states == ["lost" if c.index == victim.index else "finished" for c in before.cells]

    assert main(["sweep", "--resume", str(sweep.sweep_dir)]) == 0
    assert "submitted 1 of 4 cells (submitit-local)" in capsys.readouterr().out
    _wait(lambda: _finished(sweep.sweep_dir), 600, "the resumed cell")
    after = Sweep.open(sweep.sweep_dir)
    commits_after = _commits(after)

    # Nothing ran twice: the other cells kept their one job and their phases' commit times; the killed cell's
    # committed phases kept theirs, and only its missing phases were added, by its second job.
    for old, new in zip(before.cells, after.cells, strict=True):
        assert new.run_id == old.run_id
        if new.index == victim.index:
            assert new.attempts == 2 and new.job_id != old.job_id
            assert len(commits_after[new.index]) == 8
            assert {k: commits_after[new.index][k] for k in commits_before[new.index]} == commits_before[new.index]
        else:
            assert (new.attempts, new.job_id) == (1, old.job_id)
            assert commits_after[new.index] == commits_before[new.index]
    # No committed pair lost, and no extra run made: one run directory per cell, each with its 8 phases.
    pairs_after = _pairs(runs / victim.run_id)
    assert pairs_after[: len(pairs_before)] == pairs_before and {row[0] for row in pairs_after} == {1, 2}
    run_dirs = sorted(p.parent.name for p in runs.glob("*/spec.json"))
    assert run_dirs == sorted(c.run_id for c in after.cells)
    for cell in after.cells:
        with RunStore(runs / cell.run_id / "run.duckdb", read_only=True) as store:
            assert len(store.committed_phases(cell.run_id)) == 8
    assert main(["sweep", "--resume", str(sweep.sweep_dir)]) == 0
    assert "no cell to submit" in capsys.readouterr().out


@pytest.mark.slow
def test_a_requeued_job_checkpoints_through_submitit_and_resumes_after_its_last_finished_phase(model_dir, tmp_path):
    """SIGUSR2 is what Slurm sends before a time-out or pre-emption: submitit calls CellJob.checkpoint and requeues."""
    runs = tmp_path / "runs"
    spec = str(_spec_file(model_dir, tmp_path, num_iterations=2))
    args = ["--grid", "dpo_beta=0.1", "--runs-root", str(runs), "--launcher", "submitit-local", "--gpus-per-run", "0"]
    assert main(["sweep", spec, *args]) == 0
    sweep = _only_sweep(runs)
    job_id = sweep.cells[0].job_id

    def started() -> int:
        commits = _commits(Sweep.open(sweep.sweep_dir))[0]
        return len(commits) if 2 <= len(commits) < 8 else 0

    _wait(started, 600, "two committed phases")
    os.kill(_task_pid(job_id), signal.SIGUSR2)
    _wait(lambda: Sweep.open(sweep.sweep_dir).cells[0].attempts == 2, 120, "the requeued job")
    # The resume point is the first job's newest checkpoint, read before the second job (still loading its
    # models) can write one. A phase committed while its checkpoint was being written when the signal came runs
    # again; the phases that checkpoint covers must not.
    commits_before = _commits(Sweep.open(sweep.sweep_dir))[0]
    checkpointed = _checkpointed_phases(runs / Sweep.open(sweep.sweep_dir).cells[0].run_id)
    assert checkpointed >= 1
    kept = [f"round_{r:04d}_{phase}" for r in (1, 2) for phase in ("collect", "select", "train", "evaluate")]
    kept = kept[:checkpointed]
    _wait(lambda: _finished(sweep.sweep_dir), 600, "the requeued job to finish")
    cell = Sweep.open(sweep.sweep_dir).cells[0]
    assert (cell.attempts, cell.job_id) == (2, job_id)  # the same job, run again by its controller
    commits = _commits(Sweep.open(sweep.sweep_dir))[0]
    assert len(commits) == 8 and {k: commits[k] for k in kept} == {k: commits_before[k] for k in kept}
    log = (sweep.sweep_dir / "jobs" / f"{job_id}_0_log.out").read_text()  # submitit logs to stdout
    assert "Calling checkpoint method." in log and f"Requeued job {job_id}" in log


# The Compare page ------------------------------------------------------------------------------------------------
APP = str(Path(__file__).resolve().parents[1] / "app.py")


@pytest.fixture
def workbench(tmp_path, monkeypatch, model_dir):
    """The app on a runs folder holding one base run (a spec of the tiny model, two rounds)."""
    import streamlit as st

    from comlrl_lab.ui import services

    root = tmp_path / "runs"
    (root / "base-run").mkdir(parents=True)
    tiny_spec(model_dir, num_iterations=2).save(root / "base-run" / "spec.json")
    monkeypatch.setenv(services.RUNS_DIR_ENV, str(root))
    services.close_all()
    st.cache_resource.clear()
    yield root
    services.close_all()
    st.cache_resource.clear()


def _compare_page():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("pages/compare.py").run()
    return at


def _texts(at) -> str:
    return " | ".join([p.proto.text for p in at.get("progress")] + [c.value for c in at.caption])


def test_the_grid_panel_offers_no_launcher_where_slurm_cannot_be_reached(workbench, tmp_path, monkeypatch):
    from comlrl_lab.ui import state

    monkeypatch.setenv("PATH", f"{tmp_path / 'empty'}{os.pathsep}{os.environ['PATH']}")
    assert not cluster.slurm_available()  # no sbatch on this machine
    at = _compare_page()
    assert not at.exception
    assert not [r for r in at.radio if r.key == state.SWEEP_LAUNCHER]
    assert at.button(key=state.SWEEP_START).proto.label == "Run the grid"


def test_the_grid_panel_submits_to_slurm_and_open_a_sweep_follows_it_as_cells_finish(workbench, fake_slurm):
    from comlrl_lab.ui import state

    at = _compare_page()
    launcher = at.radio(key=state.SWEEP_LAUNCHER)
    assert launcher.options == ["This server", "Slurm cluster"] and launcher.value == "This server"
    launcher.set_value("Slurm cluster").run()
    assert at.button(key=state.SWEEP_START).proto.label == "Submit the grid"
    at.selectbox(key=state.sweep_field_key(0)).set_value("preference_replay_mode")
    at.text_input(key=state.sweep_values_key(0)).input("current, all_history")
    at.number_input(key=state.SWEEP_SEEDS).set_value(2)
    at.number_input(key=state.SWEEP_PARALLEL).set_value(2)
    at.text_input(key=state.SWEEP_PARTITION).input("gpu")
    at.text_input(key=state.SWEEP_TIME).input("1:00:00")
    at.number_input(key=state.SWEEP_GPUS).set_value(1)
    at.button(key=state.SWEEP_START).click().run()
    assert not at.exception, [e.value for e in at.exception]

    sweep_id = at.session_state[state.SWEEP_ID]
    sweep = Sweep.open(workbench / SWEEPS_DIR / sweep_id)
    assert sweep.launcher["kind"] == "slurm" and sweep.launcher["partition"] == "gpu"
    assert [c.job_id for c in sweep.cells] == ["4242_0", "4242_1", "4242_2", "4242_3"]
    script = (fake_slurm["scripts"] / "4242.sh").read_text()
    assert "#SBATCH --array=0-3%2" in script and "#SBATCH --time=60" in script and "--gpus-per-node=1" in script
    fake_slurm_commands.queue(fake_slurm["root"], *(c.job_id for c in sweep.cells))
    at.run()
    assert f"Sweep `{sweep_id}`: 0/4 runs finished, 4 queued" in _texts(at)
    assert f"comlrl-lab sweep status {sweep.sweep_dir}" in _texts(at)
    assert at.multiselect(key=state.COMPARE_TAGS).value == [sweep_id]

    # The cluster runs cell 0 (here: the job's own function, in this process); the page follows from the files.
    fake_slurm_commands.queue(fake_slurm["root"], *(c.job_id for c in sweep.cells[1:]))
    assert cluster.run_cell(sweep.sweep_dir, 0) == "cell 0 finished"
    at.run()
    assert f"Sweep `{sweep_id}`: 1/4 runs finished, 3 queued" in _texts(at)
    assert at.multiselect(key=state.COMPARE_RUNS).value == [Sweep.open(sweep.sweep_dir).cells[0].run_id]

    # A fresh session opens the sweep from the picker and follows it the same way.
    other = _compare_page()
    other.selectbox(key=state.SWEEP_OPEN).set_value(sweep_id).run()
    assert other.multiselect(key=state.COMPARE_TAGS).value == [sweep_id]
    assert f"Sweep `{sweep_id}`: 1/4 runs finished, 3 queued" in _texts(other)
    assert len(other.multiselect(key=state.COMPARE_RUNS).value) == 1


def test_the_slurm_docs_name_real_sweep_options():
    import re

    from comlrl_lab.cli import build_parser

    cluster = (Path(__file__).resolve().parents[1] / "docs" / "cluster.md").read_text(encoding="utf-8")
    section = cluster.split("## Running a grid on a Slurm cluster", 1)[1].split("\n## ", 1)[0]
    sweep = build_parser()._subparsers._group_actions[0].choices["sweep"]
    flags = {option for action in sweep._actions for option in action.option_strings}
    commands = section.split("```bash", 1)[1].split("```", 1)[0]
    table = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `--")]
    named = set(re.findall(r"(--[a-z-]+)", commands + " ".join(table)))
    assert {"--launcher", "--partition", "--time", "--gpus-per-run", "--array-parallelism"} <= named
    assert named <= flags, named - flags


@pytest.mark.slow
def test_a_slurm_job_array_runs_its_cells_to_the_end_on_a_one_node_imitation_of_slurm(
    model_dir, tmp_path, monkeypatch, capsys
):
    """The Slurm path end to end: submitit's Slurm executor, the sbatch script, and each task's job environment
    (SLURM_ARRAY_* variables) as fake_slurm.py's sbatch runs them on this machine."""
    root = tmp_path / "slurm"
    monkeypatch.setenv("PATH", f"{fake_slurm_commands.install(root, run_jobs=True)}{os.pathsep}{os.environ['PATH']}")
    runs = tmp_path / "runs"
    spec = str(_spec_file(model_dir, tmp_path))
    args = ["--grid", "dpo_beta=0.1", "--seeds", "2", "--runs-root", str(runs), "--launcher", "slurm"]
    assert main(["sweep", spec, *args, "--gpus-per-run", "0", "--array-parallelism", "1", "--time", "20"]) == 0
    sweep = _only_sweep(runs)
    _wait(lambda: _finished(sweep.sweep_dir), 600, "the job array")
    done = Sweep.open(sweep.sweep_dir)
    # Each task recorded its own job id, as Slurm's environment names it, and ran once.
    assert [(c.job_id, c.attempts) for c in done.cells] == [("4242_0", 1), ("4242_1", 1)]
    for cell in done.cells:
        with RunStore(runs / cell.run_id / "run.duckdb", read_only=True) as store:
            assert len(store.committed_phases(cell.run_id)) == 4
        log = (sweep.sweep_dir / "jobs" / f"{cell.job_id}_0_log.out").read_text()
        assert "Job completed successfully" in log
    capsys.readouterr()
    assert main(["sweep", "status", str(sweep.sweep_dir)]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"sweep {sweep.sweep_id} (slurm): 2 cells, 2 finished"


@pytest.mark.slow
def test_a_cell_with_two_gpus_per_run_runs_under_torchrun_with_two_ranks(model_dir, tmp_path):
    """--gpus-per-run 2: the job resumes its cell's run under torchrun over two ranks (gloo on this CPU machine)."""
    runs = tmp_path / "runs"
    spec = str(_spec_file(model_dir, tmp_path))
    args = ["--grid", "dpo_beta=0.1", "--runs-root", str(runs), "--launcher", "submitit-local", "--gpus-per-run", "2"]
    assert main(["sweep", spec, *args]) == 0
    sweep = _only_sweep(runs)
    _wait(lambda: Sweep.open(sweep.sweep_dir).cells[0].status in ("finished", "error"), 600, "the cell")
    cell = Sweep.open(sweep.sweep_dir).cells[0]
    log = (sweep.sweep_dir / "jobs" / f"{cell.job_id}_0_log.out").read_text()
    assert cell.status == "finished", cell.error
    assert f"finished: 2 ranks, results in {runs / cell.run_id}" in log
    with RunStore(runs / cell.run_id / "run.duckdb", read_only=True) as store:
        assert len(store.committed_phases(cell.run_id)) == 4
