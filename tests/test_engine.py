"""The engine: runs stepped in worker threads, invalid transitions, errors, stop, and kill -9 + resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest
from trainer_fixtures import small_config
from workbench_fixtures import custom_task_spec

from comlrl_lab.engine import ExperimentSpec, InvalidTransition, RunManager
from comlrl_lab.engine.manager import EngineControl
from comlrl_lab.store import RunStore
from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt
from comlrl_lab.trainers.preference.runtime.sink import PhaseCancelled

ROOT = Path(__file__).resolve().parents[1]


def small_spec(model_dir, **config) -> ExperimentSpec:
    """Two MADPOIter rounds of the small trainer settings on the example user task."""
    return custom_task_spec(
        model_dir,
        small_config("MADPOIter", **{"num_iterations": 2, "preference_pairs_per_sample": 2, "seed": 3, **config}),
    )


def test_engine_control_publishes_counts_through_the_function_it_is_given():
    published: list[dict] = []
    control = EngineControl(lambda **changes: published.append(changes))
    control.begin(2, "collect", total=4)
    control.advance(1, tokens=10)
    assert published[0] == {**published[0], "round_index": 2, "phase": "collect", "done": 0, "total": 4, "tokens": 0}
    assert published[-1]["done"] == 1 and published[-1]["tokens"] == 10
    control.cancel_event.set()
    with pytest.raises(PhaseCancelled):
        control.advance(1)


def test_manager_runs_a_round_in_the_background_and_commits_each_phase(model_dir, tmp_path):
    manager = RunManager(tmp_path / "runs")
    run_id = manager.create(small_spec(model_dir))
    manager.start(run_id, rounds=1)
    with pytest.raises(InvalidTransition, match="already running"):
        manager.start(run_id)
    progress = manager.wait(run_id, timeout=300)
    assert progress.status == "idle" and progress.round_index == 2 and progress.next_phase == "collect"
    store = manager.run(run_id).store
    phases = store.committed_phases(run_id)
    assert phases == [(1, "collect"), (1, "select"), (1, "train"), (1, "evaluate")]
    assert store.pairs_count(run_id) == len(manager.run(run_id).trainer.collector.replay.round_pairs(1))
    names = set(store.metrics(run_id)["name"])
    assert {"turn_1/reward_mean", "eval/turn_1/reward_mean", "iter/train_preference_pairs"} <= names
    manager.close()


def test_several_eval_samples_per_item_reach_the_store_and_the_learning_pages_band(model_dir, tmp_path):
    from comlrl_lab.ui.frames import eval_interval
    from comlrl_lab.ui.stats import t975

    manager = RunManager(tmp_path / "runs")
    run_id = manager.create(small_spec(model_dir, eval_samples_per_item=3))
    manager.start(run_id, rounds=1)
    assert manager.wait(run_id, timeout=300).status == "idle"
    store = manager.run(run_id).store
    stored = store.cursor().execute(
        "SELECT item_index, candidate_index, reward FROM candidates WHERE run_id = ? AND side = 'eval' "
        "ORDER BY item_index, candidate_index",
        [run_id],
    )
    rows = stored.fetchall()
    assert [(k, j) for k, j, _ in rows] == [(k, j) for k in range(2) for j in range(3)]
    curve = store.eval_curve(run_id)
    logged = dict(zip(curve["name"], curve["value"]))
    rewards = [[r for k, _, r in rows if k == item] for item in range(2)]
    within = sum(3 * sum((r - sum(item) / 3) ** 2 for r in item) / 2 for item in rewards)
    assert logged["eval/num_samples"] == 6
    assert logged["eval/turn_1/reward_mean"] == pytest.approx(sum(r for _, _, r in rows) / 6)
    assert logged["eval/turn_1/reward_sem"] == pytest.approx(within**0.5 / 6)
    band = eval_interval(store.metrics(run_id)).iloc[0]
    half = t975(5) * logged["eval/turn_1/reward_sem"]
    assert (band["low"], band["high"]) == pytest.approx(
        (logged["eval/turn_1/reward_mean"] - half, logged["eval/turn_1/reward_mean"] + half)
    )
    manager.close()


def test_phase_out_of_order_is_refused_with_a_clear_message(model_dir, tmp_path):
    manager = RunManager(tmp_path / "runs")
    run_id = manager.create(small_spec(model_dir))
    with pytest.raises(InvalidTransition, match="cannot run 'train' now: the next phase of round 1 is 'collect'"):
        manager.start(run_id, phase="train")
    manager.close()


def test_run_step_out_of_order_is_refused_by_the_trainer_and_logs_no_failure(model_dir, tmp_path):
    manager = RunManager(tmp_path / "runs")
    run = manager.run(manager.create(small_spec(model_dir)))
    with pytest.raises(InvalidTransition, match="cannot run 'select' now: the next phase of round 1 is 'collect'"):
        run.step("select")
    assert run.last_error is None and run.store.events(run.run_id, level="error").empty
    assert run.cursor() == (1, "collect")
    manager.close()


def test_the_cursor_of_a_reopened_run_reads_the_checkpoint_state_not_its_weights(model_dir, tmp_path):
    manager = RunManager(tmp_path / "runs")
    run_id = manager.create(small_spec(model_dir))
    run = manager.run(run_id)
    for phase in ("collect", "select", "train"):
        run.step(phase)
    run.trainer.wait_for_checkpoint()
    checkpoint_dir = run.checkpoint_dir
    manager.close()
    weights = sorted(checkpoint_dir.glob("checkpoint-*/weights-*.pt"))
    assert weights, "the train phase wrote its weights"
    for path in weights:  # a weights file that loaded would fail here: reading the cursor must not open it
        path.unlink()
        path.write_bytes(b"not a torch file")
    second = RunManager(tmp_path / "runs")
    reopened = second.run(second.open(checkpoint_dir.parent))
    assert reopened.cursor() == (1, "evaluate") and reopened.trainer is None
    second.close()
    newest = ckpt.latest_checkpoint(checkpoint_dir)
    state = ckpt.read_state(newest)
    assert ckpt.read_cursor(newest) == {k: state[k] for k in (*ckpt.CURSOR_KEYS, "checkpoint_path")}

    # In a process of its own (as a workbench page opens a run): the cursor comes without torch.
    code = (
        "import sys\n"
        "from comlrl_lab.engine import RunManager\n"
        f"manager = RunManager({str(tmp_path / 'runs')!r})\n"
        f"print(manager.run(manager.open({str(checkpoint_dir.parent)!r})).cursor(), 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "(1, 'evaluate') False"


def test_a_checkpoint_cursor_that_cannot_be_read_is_refused_with_its_file_named(tmp_path):
    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    (folder / ckpt.STATE_FILE).write_text("{not json")
    with pytest.raises(ValueError, match=r"state.json: not a readable checkpoint state"):
        ckpt.read_cursor(folder)
    (folder / ckpt.STATE_FILE).write_text(json.dumps({"format": 2, "round_index": 1}))
    with pytest.raises(ValueError, match=r"not a readable checkpoint state \(no phase_index, finished\)"):
        ckpt.read_cursor(folder)
    (folder / ckpt.STATE_FILE).write_text(json.dumps({"format": 7}))
    with pytest.raises(ValueError, match="unsupported checkpoint format 7"):
        ckpt.read_cursor(folder)
    # Format 1 (a pickle): refused unless trusted, before anything is unpickled.
    (folder / ckpt.STATE_FILE).unlink()
    (folder / ckpt.LEGACY_STATE_FILE).write_bytes(b"not read")
    with pytest.raises(ckpt.UntrustedCheckpoint, match="a checkpoint of an earlier version"):
        ckpt.read_cursor(folder)


def test_invalid_config_is_refused_before_anything_is_written(model_dir, tmp_path):
    manager = RunManager(tmp_path / "runs")
    with pytest.raises(
        ValueError, match="preference_replay_lambda is only valid when preference_replay_mode='lambda_decay'."
    ):
        manager.create(small_spec(model_dir, preference_replay_lambda=0.5))
    assert list((tmp_path / "runs").iterdir()) == []


def _collected_run(model_dir, tmp_path):
    """A manager, and a small run of it idle after its first collect phase, with its trainer."""
    manager = RunManager(tmp_path / "runs")
    run_id = manager.create(small_spec(model_dir))
    manager.start(run_id, phases=1)
    assert manager.wait(run_id, timeout=300).status == "idle"
    return manager, run_id, manager.run(run_id).trainer


def test_reward_exception_stops_the_run_with_traceback_and_state_intact(model_dir, tmp_path, monkeypatch):
    manager, run_id, trainer = _collected_run(model_dir, tmp_path)

    def broken(*args, **kwargs):
        raise RuntimeError("reward server down")

    monkeypatch.setattr(trainer.context, "score_task", broken)
    manager.start(run_id, phases=1)  # select: fine
    manager.wait(run_id, timeout=300)
    manager.start(run_id, phases=3)  # train, evaluate (score_task fails here), ...
    progress = manager.wait(run_id, timeout=300)
    assert progress.status == "error"
    assert "reward server down" in progress.last_error
    assert "Traceback" in progress.last_traceback
    assert progress.next_phase == "evaluate" and progress.round_index == 1
    events = manager.run(run_id).store.events(run_id, level="error")
    assert len(events) == 1 and "reward server down" in events.loc[0, "message"]
    assert (events.loc[0, "round"], events.loc[0, "phase"]) == (1, "evaluate")
    manager.close()


def test_a_reward_that_calls_sys_exit_ends_its_phase_in_error_not_in_a_run_busy_for_ever(
    model_dir, tmp_path, monkeypatch
):
    manager, run_id, trainer = _collected_run(model_dir, tmp_path)

    def exiting(*args, **kwargs):
        sys.exit(3)

    monkeypatch.setattr(trainer.context, "score_task", exiting)
    manager.start(run_id, phases=3)  # select, train, then evaluate exits
    progress = manager.wait(run_id, timeout=300)
    assert progress.status == "error" and not progress.busy
    assert progress.last_error == "SystemExit: 3"
    assert progress.next_phase == "evaluate" and progress.round_index == 1
    events = manager.run(run_id).store.events(run_id, level="error")
    assert len(events) == 1 and (events.loc[0, "round"], events.loc[0, "phase"]) == (1, "evaluate")
    manager.close()


def test_stop_cancels_the_phase_and_returns_to_the_last_finished_one(model_dir, tmp_path):
    manager = RunManager(tmp_path / "runs")
    run_id = manager.create(small_spec(model_dir, preference_num_candidates=6, max_new_tokens=12))
    manager.start(run_id, phases=1)
    deadline = time.monotonic() + 120
    while manager.progress(run_id).phase != "collect" and time.monotonic() < deadline:
        time.sleep(0.05)
    manager.stop(run_id)
    progress = manager.wait(run_id, timeout=300)
    # Either the cancel arrived in time (idle, back at collect) or the phase had already finished.
    assert progress.status == "idle"
    events = manager.run(run_id).store.events(run_id)
    assert "error" not in set(events["level"])  # a stop the user asked for is not an error
    if "stopped" in (progress.message or ""):
        assert progress.next_phase == "collect"
        assert manager.run(run_id).store.committed_phases(run_id) == []
        cancelled = events[events["message"].str.contains("cancelled")]
        assert len(cancelled) == 1 and (cancelled.iloc[0]["round"], cancelled.iloc[0]["phase"]) == (1, "collect")
    manager.close()


def test_the_event_log_keeps_starts_phases_pauses_stops_and_resumes(model_dir, tmp_path):
    manager = RunManager(tmp_path / "runs")
    run_id = manager.create(small_spec(model_dir, num_iterations=1))
    run = manager.run(run_id)
    manager.start(run_id, phases=1)
    manager.wait(run_id, timeout=300)
    manager.start(run_id, rounds=1)
    manager.pause(run_id)  # asked while select runs (or before it starts): the run stops after one phase
    assert manager.wait(run_id, timeout=300).status == "paused"
    messages = run.store.events(run_id)["message"].tolist()[::-1]  # oldest first
    # The first collect also says which path samples each agent (test_replaced_generate.py); the rest in order.
    assert [m for m in messages if m.startswith("sampling: ")] == [
        f"sampling: agent {i} (LlamaForCausalLM) samples through comlrl-lab's decode loop (row-seeded)" for i in (0, 1)
    ]
    messages = [m for m in messages if not m.startswith("sampling: ")]
    assert messages[0] == "started: collect of round 1"
    assert messages[1].startswith("models loaded in ") and messages[2].startswith("collect of round 1 done in ")
    assert messages[3] == "resumed: 3 phases from select of round 1"
    assert any(m.startswith("pause asked") for m in messages) and messages[-1].startswith("paused before ")

    # A stop cancels the phase; running it again commits that phase, and the log about it stays.
    _, phase = run.cursor()
    manager.start(run_id, phases=1)
    manager.stop(run_id)
    manager.wait(run_id, timeout=300)
    manager.start(run_id, rounds=1)
    assert manager.wait(run_id, timeout=300).status == "finished"
    events = run.store.events(run_id)
    messages = events["message"].tolist()[::-1]
    assert any(m == f"stop asked during {phase}" for m in messages)
    assert messages[-1] == "finished: all 1 rounds"
    assert f"{phase} of round 1 done in" in " ".join(messages)
    manager.close()


def test_a_finished_runs_store_and_snapshot_both_say_finished(model_dir, tmp_path):
    import pandas as pd

    manager = RunManager(tmp_path / "runs")
    run_id = manager.create(small_spec(model_dir, num_iterations=1))
    manager.start(run_id, phases=2)
    manager.wait(run_id, timeout=300)
    snapshot = manager.run(run_id).run_dir / "snapshots" / "runs.parquet"
    assert pd.read_parquet(snapshot)["status"].tolist() == ["running"]
    manager.start(run_id, rounds=1)
    assert manager.wait(run_id, timeout=300).status == "finished"
    assert manager.run(run_id).store.run(run_id)["status"] == "finished"
    assert pd.read_parquet(snapshot)["status"].tolist() == ["finished"]
    manager.close()


@pytest.mark.slow
def test_kill_9_during_training_then_resume_keeps_every_committed_row_once(model_dir, tmp_path):
    spec_path = tmp_path / "spec.json"
    small_spec(model_dir, num_iterations=3).save(spec_path)
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-m", "comlrl_lab.cli", "run", str(spec_path), "--runs-root", str(runs), "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    state_file = None
    deadline = time.monotonic() + 300
    # Kill once round 2's training has started: its collect and select are committed, train is not.
    while time.monotonic() < deadline:
        dirs = sorted(runs.glob("*/checkpoint/checkpoint-*/state.json"))
        if dirs:
            state_file = dirs[-1]
            try:
                state = json.loads(state_file.read_text(encoding="utf-8"))
            except (OSError, ValueError):  # pruned or renamed between the glob and the read
                state = None
            if state and state["round_index"] == 2 and state["phase_index"] == 2:
                break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)  # also closes the pipes, which wait() would leave open (ResourceWarning)
    assert state_file is not None, "the run never checkpointed"
    run_dir = state_file.parent.parent.parent

    with duckdb.connect(str(run_dir / "run.duckdb"), read_only=True) as con:
        committed_before = con.execute("select count(*) from pairs").fetchone()[0]
    resumed = subprocess.run(
        [sys.executable, "-m", "comlrl_lab.cli", "run", "--resume", str(run_dir), "--runs-root", str(runs), "--quiet"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "Loading weights" not in resumed.stderr  # transformers' bars stay out of the CLI's output

    with RunStore(run_dir / "run.duckdb", read_only=True) as store:
        run_id = store.first_run_id()
        pairs = store.readonly_sql("select round, pair_index, count(*) as n from pairs group by all having n > 1")
        assert pairs.empty
        metrics = store.readonly_sql("select round, step, name, count(*) as n from metrics group by all having n > 1")
        assert metrics.empty
        phases = store.committed_phases(run_id)
        assert len(phases) == 12  # 3 rounds x 4 phases, each once
        assert store.pairs_count(run_id) >= committed_before


def test_the_phase_eta_comes_from_the_same_phase_in_earlier_rounds():
    from comlrl_lab.engine.manager import Progress

    # Half the steps in 5 s and no history: the phase's own rate says 5 s more.
    running = Progress("r", status="running", phase="train", done=5, total=10, started_at=100.0)
    assert running.eta(now=105.0) == pytest.approx(5.0)
    # The last train phases took 24 s: 19 s more, though the counts alone would say 5.
    history = {"train": (30.0, 24.0, 24.0, 24.0)}
    assert replace(running, history=history).eta(now=105.0) == pytest.approx(19.0)


def test_a_spec_validates_its_config_once_and_every_reader_shares_it(monkeypatch):
    from comlrl_lab.trainers.preference import MADPOIterConfig
    from comlrl_lab.trainers.preference.config import ConfigError

    built = []
    validate = MADPOIterConfig.__post_init__
    monkeypatch.setattr(MADPOIterConfig, "__post_init__", lambda self: built.append(self) or validate(self))
    spec = ExperimentSpec(algorithm="MADPOIter", config={"num_iterations": 3, "preference_source": "human"})
    assert spec.num_rounds() == 3 and spec.round_phases() == ("collect", "label", "select", "train", "evaluate")
    assert spec.validated_config() is spec.validated_config() is built[0]
    copy = spec.build_config()  # a trainer's own copy: changing it leaves the spec's config alone
    copy.output_dir = "elsewhere"
    assert copy is not built[0] and spec.validated_config().output_dir != "elsewhere" and len(built) == 1
    spec.config["num_iterations"] = 2  # an override changed afterwards is validated again, once
    assert spec.num_rounds() == 2 and spec.num_rounds() == 2 and len(built) == 2
    with pytest.raises(ConfigError, match="num_iterations"):
        ExperimentSpec(algorithm="MADPOIter", config={"num_iterations": 0}).num_rounds()
