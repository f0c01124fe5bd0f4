"""The app writes only where it should: folder fields stay inside the run directory, foreign DuckDB files are not
changed, and a reopened run has no file of a phase it never finished."""

from __future__ import annotations

import json

import duckdb
import pytest
from workbench_fixtures import user_task_spec

from comlrl_lab.engine import RunManager
from comlrl_lab.engine.run import Run
from comlrl_lab.engine.spec import inside_run_dir
from comlrl_lab.store.schema import PHASES, SchemaVersionError
from comlrl_lab.trainers.preference.rounds.replay import RUN_MARKER
from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt
from comlrl_lab.ui.services import Workspace


@pytest.mark.parametrize("field", ["preference_replay_dir", "policy_checkpoint_dir"])
@pytest.mark.parametrize("value", ["/tmp/anywhere", "../../escape", "~/replay"])
def test_folders_from_the_form_cannot_leave_the_run_directory(tmp_path, field, value):
    manager = RunManager(tmp_path / "runs")
    with pytest.raises(ValueError, match=f"{field} must be a folder inside the run directory"):
        manager.create(user_task_spec(**{field: value}))
    assert list((tmp_path / "runs").iterdir()) == []
    manager.close()


def test_a_relative_folder_is_anchored_in_the_run_directory(tmp_path):
    config = user_task_spec(preference_replay_dir="replay_b", policy_checkpoint_dir="hist/a").build_config()
    inside_run_dir(config, tmp_path / "run-1")
    assert config.preference_replay_dir == str(tmp_path / "run-1" / "replay_b")
    assert config.policy_checkpoint_dir == str(tmp_path / "run-1" / "hist" / "a")


def test_another_tools_duckdb_file_is_left_unchanged(tmp_path):
    folder = tmp_path / "runs" / "other"  # in the runs folder: the only place the workspace opens anything
    folder.mkdir(parents=True)
    with duckdb.connect(str(folder / "run.duckdb")) as con:
        con.execute("CREATE TABLE customers (id INTEGER)")
    ws = Workspace(tmp_path / "runs")
    try:
        with pytest.raises(
            SchemaVersionError, match=r"not a comlrl-lab store: the file holds other tables \(customers\)"
        ):
            ws.open_dir(folder)
    finally:
        ws.close()
    with duckdb.connect(str(folder / "run.duckdb"), read_only=True) as con:
        assert con.execute("SELECT table_name FROM duckdb_tables()").fetchall() == [("customers",)]


def test_open_reconciles_round_files_and_removes_stale_checkpoint_tmp(tmp_path):
    run = Run.create(user_task_spec(num_iterations=3), tmp_path)
    for phase in PHASES:  # the store holds what the checkpoint below says was done, and round 3's collect besides
        run.store.commit_phase(run.run_id, 1, phase)
    run.store.commit_phase(run.run_id, 2, "collect")
    run.close()
    replay = run.run_dir / "preference_replay"
    replay.mkdir()
    (replay / RUN_MARKER).write_text(run.run_id + "\n")
    for r in (1, 2, 3):
        (replay / f"iteration_000{r}.json").write_text(json.dumps({"iteration": r, "num_pairs": 0, "pairs": []}))
    # Killed after round 2's collect was checkpointed, while round 3's collect was writing its file.
    ckpt.save_checkpoint(run.checkpoint_dir, {"round_index": 2, "phase_index": 1, "finished": False}, {}, version=1)
    stale = run.checkpoint_dir / ".weights-000002.pt.tmp-999999"
    stale.write_bytes(b"half a tensor")
    reopened = Run.open(run.run_dir)
    reopened.close()
    assert sorted(p.name for p in replay.glob("iteration_*.json")) == ["iteration_0001.json", "iteration_0002.json"]
    assert not stale.exists() and (run.checkpoint_dir / "checkpoint-000001" / ckpt.STATE_FILE).is_file()


def test_open_without_a_checkpoint_drops_every_round_file(tmp_path):
    run = Run.create(user_task_spec(), tmp_path)
    run.close()
    replay = run.run_dir / "preference_replay"
    replay.mkdir()
    (replay / RUN_MARKER).write_text(run.run_id + "\n")
    (replay / "iteration_0001.json").write_text('{"iteration": 1, "num_pairs": 0, "pairs": []}')
    (replay / "notes.txt").write_text("kept")
    Run.open(run.run_dir).close()
    assert sorted(p.name for p in replay.iterdir()) == [RUN_MARKER, "notes.txt"]
