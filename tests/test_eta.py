"""Estimates of the time left (engine/eta.py, Progress, the CLI's bar) against hand-computed answers."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from workbench_fixtures import seed_spec

from comlrl_lab.engine import eta
from comlrl_lab.engine.manager import LOAD, Progress
from comlrl_lab.engine.progress_text import bar_text

ROOT = Path(__file__).resolve().parents[1]


def test_a_phase_slower_than_before_is_estimated_from_its_own_rate_not_stuck_at_zero():
    past = [40.0, 42.0, 44.0]  # mean 42 s
    assert eta.phase_eta(10.0, 0, 128, past) == pytest.approx(32.0)
    # 50 s in (past the 42 s the earlier rounds took) with 96 of 128 done: 50 * 32 / 96 = 16.67 s, not "0 s".
    assert eta.phase_eta(50.0, 96, 128, past) == pytest.approx(50 * 32 / 96)
    # Everything counted and the history exceeded: unknown (the page says "finishing"), never 0.
    assert eta.phase_eta(60.0, 128, 128, past) is None
    assert eta.phase_eta(5.0, 0, 10, None) is None  # no history and no step done yet


def test_the_recent_history_is_the_last_three_runs():
    assert eta.mean_recent([100.0, 10.0, 20.0, 30.0]) == pytest.approx(20.0)
    assert eta.mean_recent([]) is None


def test_the_queue_eta_adds_each_later_phases_recent_mean():
    history = {"collect": (10.0,), "select": (1.0,), "train": (20.0, 30.0), "evaluate": (4.0,)}
    later = eta.queued_phases("train", 6)[1:]
    assert later == ["evaluate", "collect", "select", "train", "evaluate"]
    assert eta.queue_eta(12.0, later, history) == pytest.approx(12 + 4 + 10 + 1 + 25 + 4)
    assert eta.queue_eta(12.0, ["collect"], {}) is None  # the first round has nothing to go on
    assert eta.queue_eta(None, [], history) is None


def test_a_sweep_eta_spreads_the_cells_left_over_the_parallel_slots():
    # Finished cells took 60 and 80 s (mean 70); one running for 30 s (40 left), three pending: 40 + 210 = 250 s
    # of work on 2 slots.
    assert eta.sweep_eta([60.0, 80.0], [30.0], 3, 2) == pytest.approx(125.0)
    assert eta.sweep_eta([], [30.0], 3, 2) is None


def test_progress_estimates_loading_from_earlier_loads_and_the_whole_queue():
    history = {LOAD: (8.0,), "collect": (10.0,), "select": (1.0,), "train": (20.0,), "evaluate": (4.0,)}
    loading = Progress("r", status="loading", next_phase="collect", phases_left=4, started_at=100.0, history=history)
    assert loading.eta(now=103.0) == pytest.approx(5.0)
    assert loading.queue_eta(now=103.0) == pytest.approx(5 + 10 + 1 + 20 + 4)
    running = Progress(
        "r", status="running", phase="train", done=0, total=8, phases_left=2, started_at=100.0, history=history
    )
    assert running.queue_eta(now=105.0) == pytest.approx(15 + 4)
    assert Progress("r", status="idle", history=history).queue_eta() is None


def test_the_cli_bar_names_the_phase_its_unit_and_never_a_round_past_the_last():
    finished = Progress("r", status="finished", round_index=6, num_rounds=5, next_phase=None)
    assert bar_text(finished) == ("done: 5/5 rounds", "step", None)
    collect = Progress("r", status="running", round_index=2, num_rounds=5, phase="collect", started_at=None)
    assert bar_text(collect)[:2] == ("round 2/5 collect", "prompt")
    loading = Progress("r", status="loading", round_index=1, num_rounds=5, next_phase="collect", phases_left=20)
    assert bar_text(loading) == ("loading models", "step", None)  # no load measured yet in this process


def test_the_cli_writes_one_line_per_phase_when_stderr_is_not_a_terminal(tmp_path, model_dir):
    # Issue 49: a tqdm bar written to a file became thousands of carriage-return updates with stale labels. The CLI
    # runs as a user runs it, its stderr going to a file.
    spec_file = tmp_path / "spec.json"
    dataclasses.replace(seed_spec(model_dir, num_iterations=1), max_train_items=4, max_eval_items=2).save(spec_file)
    log = tmp_path / "stderr.log"
    with open(log, "w") as stderr:
        code = subprocess.run(
            [sys.executable, "-c", "import sys; from comlrl_lab import cli; sys.exit(cli.main(sys.argv[1:]))"]
            + ["run", str(spec_file), "--runs-root", str(tmp_path / "runs")],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            timeout=300,
            check=False,
        ).returncode
    err = log.read_text()
    assert code == 0, err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if re.fullmatch(r"(loading models|round 1/1 \w+): \d+\.\d s", line)]
    assert [line.split(":")[0] for line in lines] == [
        "loading models",
        "round 1/1 collect",
        "round 1/1 select",
        "round 1/1 train",
        "round 1/1 evaluate",
    ], err
