"""User mistakes on the command line: one line naming file, line and field, exit status 2, and no work done.

Each case also checks that no run directory was left behind, and ``--verbose`` that the traceback is still there.
A run that fails later is marked ``failed`` in ``runs.status``; a stop is not a failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from store_fixtures import held_store
from workbench_fixtures import user_task_spec

from comlrl_lab import cli
from comlrl_lab.engine import ExperimentSpec
from comlrl_lab.engine.run import Run
from comlrl_lab.store import RunStore
from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt
from comlrl_lab.trainers.preference.runtime.sink import PhaseCancelled

ROOT = Path(__file__).resolve().parents[1]


def run_cli(tmp_path: Path, capsys, *argv: str) -> tuple[int, list[str]]:
    runs = tmp_path / "runs"
    code = cli.main([*argv, "--runs-root", str(runs)] if argv[0] == "run" else list(argv))
    err = capsys.readouterr().err.strip().splitlines()
    if runs.exists():
        assert list(runs.iterdir()) == [], "a mistake left a run directory behind"
    return code, err


SPEC_MISTAKES = [
    (
        "spec.yaml",
        "algorithm: MADPOIter\nconfig:\n  num_iterations: 2\n   bad: [\n",
        "spec.yaml:4:7: YAML syntax error",
    ),
    (
        "spec.json",
        '{"algorithm": "MADPOIter",\n "config": {"num_iterations": 2}',
        "spec.json:2:33: JSON syntax error: Expecting ',' delimiter",
    ),
    (
        "spec.yaml",
        "algorithm: MADPOIter\nagent_model: [comlrl-lab/tiny]\n",
        "spec.yaml:2: unknown spec key 'agent_model'; did you mean 'agent_models'?",
    ),
    (
        "spec.yaml",
        "algorithm: MADPOIter\nconfig:\n  num_iteration: 2\n",
        "spec.yaml:3: config: MADPOIterConfig has no field 'num_iteration'; did you mean 'num_iterations'?",
    ),
    (
        "spec.json",
        '{"algorithm": "MADPOIter",\n "config": {\n  "preference_num_candidates": 0}}',
        "spec.json:3: preference_num_candidates must be >= 2.",
    ),
    ("spec.yaml", "algorithm: MADPOiter\n", "spec.yaml:1: algorithm must be one of"),
    ("spec.yaml", "- a list\n", "spec.yaml: an experiment spec must be a mapping"),
]


@pytest.mark.parametrize(("name", "text", "expected"), SPEC_MISTAKES)
def test_a_spec_mistake_is_one_line_naming_file_line_and_field(tmp_path, capsys, monkeypatch, name, text, expected):
    monkeypatch.chdir(tmp_path)
    Path(name).write_text(text)
    code, err = run_cli(tmp_path, capsys, "run", name)
    assert code == 2
    assert err == [f"comlrl-lab run: {expected}"] or (len(err) == 1 and expected in err[0])


def test_yaml_numbers_are_numbers():
    spec = ExperimentSpec.load(ROOT / "examples" / "madpo_iter_tiny.yaml")  # agent_learning_rate: 1.0e-3
    assert spec.config["agent_learning_rate"] == 0.001


def test_yaml_1e_minus_3_is_read_as_a_number(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("algorithm: MADPOIter\nconfig:\n  agent_learning_rate: 1e-3\n  num_iterations: 2\n")
    spec = ExperimentSpec.load(path)
    assert spec.config["agent_learning_rate"] == 0.001 and isinstance(spec.config["agent_learning_rate"], float)
    assert spec.build_config().agent_learning_rate == 0.001


def test_missing_file_and_verbose_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_cli(tmp_path, capsys, "run", "nope.yaml") == (2, ["comlrl-lab run: nope.yaml: no such spec file"])
    assert cli.main(["run", "nope.yaml", "--verbose", "--runs-root", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "SpecError" in err
    assert err.strip().splitlines()[-1] == "comlrl-lab run: nope.yaml: no such spec file"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"user_train_data": "/no/such/data.jsonl"}, "data.jsonl"),
        ({"user_task": "/no/such/task.py"}, "task.py"),
        ({"agent_models": ["./no-such-model", "./no-such-model"]}, "no-such-model"),
        ({"config": {"num_iterations": 1, "agent_devices": "cuda:7"}}, "agent_devices"),
        ({"config": {"num_iterations": 1, "agent_devices": "tpu:0"}}, "agent_devices"),
    ],
)
def test_task_data_models_and_devices_are_checked_before_the_run_directory(tmp_path, capsys, change, expected):
    spec = user_task_spec()
    for key, value in change.items():
        setattr(spec, key, value)
    path = tmp_path / "spec.json"
    spec.save(path)
    code, err = run_cli(tmp_path, capsys, "run", str(path))
    assert code == 2 and len(err) == 1 and expected in err[0]


def test_resume_of_a_non_run_and_of_a_finished_run(tmp_path, capsys):
    code, err = run_cli(tmp_path, capsys, "run", "--resume", str(tmp_path))
    assert code == 2 and err == [f"comlrl-lab run: {tmp_path} is not a comlrl-lab run directory (no spec.json)"]
    run = Run.create(user_task_spec(), tmp_path / "made")
    ckpt.save_checkpoint(
        run.checkpoint_dir, {"round_index": 1, "phase_index": 0, "finished": True}, {"agents": []}, version=1
    )
    run.close()
    code, err = run_cli(tmp_path, capsys, "run", "--resume", str(run.run_dir))
    assert code == 2 and len(err) == 1 and "has finished all its rounds" in err[0]


def test_the_lock_conflict_names_the_process_that_holds_the_run(tmp_path, capsys):
    store_path = tmp_path / "run" / "run.duckdb"
    RunStore(store_path).close()
    with held_store(store_path) as holder:
        code, err = run_cli(tmp_path, capsys, "export", str(store_path.parent), "--dest", str(tmp_path / "x.json"))
    assert code == 2 and len(err) == 1
    assert f"{store_path} is held by process {holder.pid} (" in err[0] and "duckdb.connect" in err[0]


def test_an_export_failure_is_one_line(tmp_path, capsys):
    with RunStore(tmp_path / "run" / "run.duckdb"):
        pass
    code, err = run_cli(tmp_path, capsys, "export", str(tmp_path / "run"), "--dest", str(tmp_path / "x.json"))
    assert (
        code == 2
        and err == [f"comlrl-lab export: {tmp_path / 'run' / 'run.duckdb'} holds no run"]
        or (len(err) == 1 and "holds no run" in err[0])
    )
    code, err = run_cli(tmp_path, capsys, "export", str(tmp_path / "nowhere"), "--dest", str(tmp_path / "x.json"))
    assert code == 2 and len(err) == 1 and "nowhere" in err[0]


class _FailingTrainer:
    finished = False
    num_rounds = 1
    round_index = 1
    next_phase = "collect"

    def __init__(self, error: BaseException):
        self.error = error

    def step(self, expected_phase=None):
        raise self.error

    def load_checkpoint(self, directory):
        raise AssertionError("no checkpoint was written")


def test_a_run_that_fails_later_is_marked_failed_and_a_stop_is_not(tmp_path):
    run = Run.create(user_task_spec(), tmp_path)
    assert run.store.run(run.run_id)["status"] == "created"
    run.trainer = _FailingTrainer(PhaseCancelled("collect of round 1 was cancelled"))
    with pytest.raises(PhaseCancelled):
        run.step()
    assert run.store.run(run.run_id)["status"] == "created"
    run.trainer = _FailingTrainer(RuntimeError("CUDA out of memory"))
    with pytest.raises(RuntimeError):
        run.step()
    assert run.store.run(run.run_id)["status"] == "failed"
    run.close()
