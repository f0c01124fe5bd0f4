"""Sweeps: grid values typed by the config field, cells as tagged run directories, K at a time, and resume."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from compare_fixtures import write_run
from trainer_fixtures import small_config
from workbench_fixtures import custom_task_spec

from comlrl_lab.cli import main
from comlrl_lab.engine import ExperimentSpec, Run
from comlrl_lab.engine.sweep import (
    MANIFEST_FILE,
    SWEEPS_DIR,
    Bundle,
    Sweep,
    check_sweep_size,
    parse_grid,
    split_values,
    sweep_memberships,
)
from comlrl_lab.store import RunStore
from comlrl_lab.trainers.preference import MADPOIterConfig
from comlrl_lab.ui.compare import catalogue

ROOT = Path(__file__).resolve().parents[1]


def tiny_spec(model_dir, **config) -> ExperimentSpec:
    """One MADPOIter round of the small trainer settings on two items of the example user task."""
    values = small_config("MADPOIter", **{"preference_pairs_per_sample": 2, "max_new_tokens": 4, "seed": 5, **config})
    return custom_task_spec(model_dir, values, max_train_items=2, max_eval_items=2)


def test_grid_values_take_the_config_fields_types():
    grid = parse_grid(
        MADPOIterConfig,
        [
            "dpo_beta=0.1,0.5",
            "num_train_epochs=1,3",
            "score_final_token=true,False",
            "preference_replay_k=none,2",
            "preference_replay_mode=nearest_k,all_history",
        ],
    )
    assert grid == {
        "dpo_beta": [0.1, 0.5],
        "num_train_epochs": [1, 3],
        "score_final_token": [True, False],
        "preference_replay_k": [None, 2],
        "preference_replay_mode": ["nearest_k", "all_history"],
    }
    assert type(grid["num_train_epochs"][0]) is int and type(grid["dpo_beta"][0]) is float


def test_grid_commas_inside_json_brackets_stay_in_one_value():
    assert split_values('a, [1, 2] ,{"k": [3, 4]}') == ["a", "[1, 2]", '{"k": [3, 4]}']


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("learning_rate=1e-4", "MADPOIterConfig has no field 'learning_rate'; did you mean 'agent_learning_rate'?"),
        ("num_train_epochs=1,two", "grid field num_train_epochs: 'two' is not an int"),
        ("score_final_token=maybe", "grid field score_final_token: 'maybe' is not a bool"),
        ("seed=1,2", "seed is swept with --seeds N"),
        ("dpo_beta", "a grid entry must read FIELD=V1,V2"),
        ("dpo_beta=0.1,0.1", "grid field dpo_beta repeats a value"),
    ],
)
def test_bad_grid_entries_are_refused_with_a_clear_message(entry, message):
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        parse_grid(MADPOIterConfig, [entry])


def test_sweep_makes_one_cell_per_grid_point_and_seed_with_seeds_counting_from_the_spec(model_dir, tmp_path):
    grid = {"dpo_beta": [0.1, 0.5], "preference_replay_mode": ["current", "all_history"]}
    sweep = Sweep.create(tiny_spec(model_dir), grid, seeds=2, runs_root=tmp_path, parallel=2)
    assert sweep.sweep_dir.parent == tmp_path / SWEEPS_DIR
    assert sweep.seeds == [5, 6]
    assert len(sweep.cells) == 8
    assert sweep.cells[0].overrides == {"dpo_beta": 0.1, "preference_replay_mode": "current", "seed": 5}
    assert sweep.cells[-1].overrides == {"dpo_beta": 0.5, "preference_replay_mode": "all_history", "seed": 6}
    spec = sweep.cell_spec(sweep.cells[3])
    assert spec.tags == [sweep.sweep_id]
    assert spec.config["seed"] == 6 and spec.config["preference_replay_mode"] == "all_history"
    reopened = Sweep.open(sweep.sweep_dir)
    assert [c.overrides for c in reopened.cells] == [c.overrides for c in sweep.cells]
    assert reopened.parallel == 2 and all(c.status == "pending" for c in reopened.cells)


def test_a_cell_with_an_invalid_config_refuses_the_whole_sweep_before_anything_is_written(model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"^dpo_beta must be > 0\.$"):
        Sweep.create(tiny_spec(model_dir), {"dpo_beta": [0.1, -1.0]}, seeds=1, runs_root=tmp_path)
    assert not (tmp_path / SWEEPS_DIR).exists()


def test_the_readme_replay_mode_question_is_one_grid_each_mode_with_its_suggested_setting(model_dir, tmp_path):
    """``--grid preference_replay_mode=nearest_k,lambda_decay``: nearest_k gets k 2 and lambda_decay λ 0.5, the
    values the Setup form fills in (the fields' ``suggested``), and each cell's config builds."""
    spec = tiny_spec(model_dir)  # preference_replay_mode current: neither k nor λ set
    grid = parse_grid(MADPOIterConfig, ["preference_replay_mode=nearest_k,lambda_decay"])
    sweep = Sweep.create(spec, grid, seeds=2, runs_root=tmp_path)
    assert [c.overrides for c in sweep.cells] == [
        {"preference_replay_mode": "nearest_k", "preference_replay_k": 2, "seed": 5},
        {"preference_replay_mode": "nearest_k", "preference_replay_k": 2, "seed": 6},
        {"preference_replay_mode": "lambda_decay", "preference_replay_lambda": 0.5, "seed": 5},
        {"preference_replay_mode": "lambda_decay", "preference_replay_lambda": 0.5, "seed": 6},
    ]
    config = sweep.cell_spec(sweep.cells[2]).build_config()
    assert (config.preference_replay_lambda, config.preference_replay_k) == (0.5, None)


def test_a_cell_drops_the_base_values_and_grid_values_that_do_not_apply_to_it(model_dir, tmp_path):
    spec = tiny_spec(model_dir, preference_replay_mode="lambda_decay", preference_replay_lambda=0.25)
    grid = {"preference_replay_mode": ["current", "lambda_decay", "nearest_k"], "preference_replay_k": [1, 3]}
    sweep = Sweep.create(spec, grid, seeds=1, runs_root=tmp_path)
    # The base's λ means nothing under current or nearest_k; k means nothing but under nearest_k, so the current
    # and lambda_decay points of k 1 and k 3 are one cell each. λ 0.25 stays where it applies.
    assert [c.overrides for c in sweep.cells] == [
        {"preference_replay_mode": "current", "preference_replay_lambda": None, "seed": 5},
        {"preference_replay_mode": "lambda_decay", "seed": 5},
        {"preference_replay_mode": "nearest_k", "preference_replay_k": 1, "preference_replay_lambda": None, "seed": 5},
        {"preference_replay_mode": "nearest_k", "preference_replay_k": 3, "preference_replay_lambda": None, "seed": 5},
    ]
    size = check_sweep_size(spec, grid, seeds=2, runs_root=tmp_path / "runs")
    assert size.cells == 8


def test_a_grid_value_brings_fields_along_and_the_manifest_keeps_it(model_dir, tmp_path):
    grid = parse_grid(
        MADPOIterConfig,
        ["preference_replay_mode=nearest_k:k=4:sample_size=8, lambda_decay:preference_replay_lambda=0.9, current"],
    )
    assert grid == {
        "preference_replay_mode": [
            Bundle("nearest_k", {"preference_replay_k": 4, "preference_replay_sample_size": 8}),
            Bundle("lambda_decay", {"preference_replay_lambda": 0.9}),
            "current",
        ]
    }
    sweep = Sweep.create(tiny_spec(model_dir), grid, seeds=1, runs_root=tmp_path)
    assert [c.overrides for c in sweep.cells] == [
        {
            "preference_replay_mode": "nearest_k",
            "preference_replay_k": 4,
            "preference_replay_sample_size": 8,
            "seed": 5,
        },
        {"preference_replay_mode": "lambda_decay", "preference_replay_lambda": 0.9, "seed": 5},
        {"preference_replay_mode": "current", "seed": 5},
    ]
    assert Sweep.open(sweep.sweep_dir).grid == grid
    saved = json.loads((sweep.sweep_dir / MANIFEST_FILE).read_text())["grid"]
    assert saved["preference_replay_mode"][1] == {"value": "lambda_decay", "with": {"preference_replay_lambda": 0.9}}


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            "preference_replay_mode=nearest_k:lam=0.5",
            "grid field preference_replay_mode: 'nearest_k:lam=0.5' names no field 'lam'; with nearest_k go k, "
            "sample_size, or any field by its full name",
        ),
        (
            "preference_replay_mode=nearest_k:lambda=0.5",
            "grid field preference_replay_mode: 'nearest_k:lambda=0.5' sets preference_replay_lambda, which does not "
            "apply when preference_replay_mode='nearest_k'",
        ),
        (
            "preference_replay_mode=nearest_k:k=two",
            "grid field preference_replay_mode: 'nearest_k:k=two' sets preference_replay_k: 'two' is not an int",
        ),
    ],
)
def test_a_bundle_naming_no_field_or_a_field_of_another_mode_is_refused(entry, message):
    with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
        parse_grid(MADPOIterConfig, [entry])


def test_a_colon_that_starts_no_bundle_stays_in_the_value():
    assert parse_grid(MADPOIterConfig, ["agent_devices=cuda:0,cpu"]) == {"agent_devices": ["cuda:0", "cpu"]}


def test_a_grid_field_that_applies_in_no_cell_is_refused(model_dir, tmp_path):
    with pytest.raises(ValueError, match="^grid field preference_replay_k applies in no cell: only when "):
        Sweep.create(tiny_spec(model_dir), {"preference_replay_k": [1, 2]}, seeds=1, runs_root=tmp_path)
    assert not (tmp_path / SWEEPS_DIR).exists()


def test_a_seeds_only_grid_needs_no_field(model_dir, tmp_path):
    sweep = Sweep.create(tiny_spec(model_dir), {}, seeds=3, runs_root=tmp_path)
    assert [c.overrides for c in sweep.cells] == [{"seed": 5}, {"seed": 6}, {"seed": 7}]


def test_the_base_runs_own_cell_is_the_base_run_once_it_has_finished(tmp_path):
    runs = tmp_path / "runs"
    base_dir = write_run(runs, "base-run", config={"seed": 3, "num_iterations": 2}, rounds=2, eval_reward=float)
    spec = ExperimentSpec.load(base_dir / "spec.json")
    sweep = Sweep.create(spec, {}, seeds=3, runs_root=runs, base_run=base_dir)
    assert [(c.overrides, c.run_id, c.status) for c in sweep.cells] == [
        ({"seed": 3}, "base-run", "finished"),
        ({"seed": 4}, None, "pending"),
        ({"seed": 5}, None, "pending"),
    ]
    assert [c.index for c in sweep.unfinished] == [1, 2]
    # The Compare page's tag filter finds the base run among the sweep's runs, though its spec has no such tag.
    assert sweep_memberships(runs) == {"base-run": (sweep.sweep_id,)}
    (entry,) = catalogue(runs)
    assert entry.tags == (sweep.sweep_id,)

    # A grid point that keeps the base run's settings reuses it too; the other mode's cells all run.
    grid = parse_grid(spec.config_class, ["preference_replay_mode=current,all_history"])
    sweep = Sweep.create(spec, grid, seeds=2, runs_root=runs, base_run=base_dir)
    assert [c.run_id for c in sweep.cells] == ["base-run", None, None, None]

    with pytest.raises(ValueError, match="^every cell of this grid is the base run itself"):
        Sweep.create(spec, {}, seeds=1, runs_root=runs, base_run=base_dir)


def test_a_base_run_that_has_not_finished_is_not_reused(tmp_path):
    runs = tmp_path / "runs"
    base_dir = write_run(
        runs, "base-run", config={"seed": 3, "num_iterations": 2}, rounds=1, eval_reward=float, status="running"
    )
    sweep = Sweep.create(ExperimentSpec.load(base_dir / "spec.json"), {}, seeds=2, runs_root=runs, base_run=base_dir)
    assert [(c.run_id, c.status) for c in sweep.cells] == [(None, "pending"), (None, "pending")]


def test_the_grid_may_supply_what_the_base_spec_lacks(model_dir, tmp_path):
    spec = tiny_spec(model_dir, preference_replay_mode="nearest_k")  # invalid alone: nearest_k needs a k
    sweep = Sweep.create(spec, {"preference_replay_k": [1, 2]}, seeds=1, runs_root=tmp_path)
    assert [c.overrides for c in sweep.cells] == [
        {"preference_replay_k": 1, "seed": 5},
        {"preference_replay_k": 2, "seed": 5},
    ]


def test_cli_sweep_refuses_an_unknown_field_with_exit_2(model_dir, tmp_path, capsys):
    spec_path = tmp_path / "spec.json"
    tiny_spec(model_dir).save(spec_path)
    code = main(["sweep", str(spec_path), "--grid", "beta=0.1,0.2", "--runs-root", str(tmp_path / "runs")])
    assert code == 2
    assert "MADPOIterConfig has no field 'beta'; did you mean 'dpo_beta'?" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_sweep_runs_every_cell_as_a_tagged_run_and_resume_finishes_an_interrupted_cell(model_dir, tmp_path):
    runs = tmp_path / "runs"
    spec_path = tmp_path / "spec.json"
    tiny_spec(model_dir).save(spec_path)
    grid = ["preference_replay_mode=nearest_k,lambda_decay"]  # the README's recipe: each mode with its own k or λ
    code = main(
        [
            "sweep",
            str(spec_path),
            "--grid",
            *grid,
            "--seeds",
            "2",
            "--parallel",
            "2",
            "--runs-root",
            str(runs),
            "--quiet",
        ]
    )
    assert code == 0
    (sweep_dir,) = (runs / SWEEPS_DIR).iterdir()
    manifest = json.loads((sweep_dir / MANIFEST_FILE).read_text())
    assert [c["status"] for c in manifest["cells"]] == ["finished"] * 4
    for cell in manifest["cells"]:
        run_dir = runs / cell["run_id"]
        spec = json.loads((run_dir / "spec.json").read_text())
        assert spec["tags"] == [manifest["sweep_id"]]
        assert {name: spec["config"][name] for name in cell["overrides"]} == cell["overrides"]
        assert (run_dir / "snapshots" / "metrics").is_dir()
        with RunStore(run_dir / "run.duckdb", read_only=True) as store:
            assert len(store.committed_phases(cell["run_id"])) == 4

    # An interrupted sweep: one cell stopped after its collect phase, one never started.
    sweep = Sweep.create(tiny_spec(model_dir), {"dpo_beta": [0.1]}, seeds=2, runs_root=runs)
    first = sweep.cells[0]
    run = Run.create(sweep.cell_spec(first), runs)
    run.step("collect")
    run.close()
    first.run_id, first.status = run.run_id, "running"
    sweep.save()
    assert main(["sweep", "--resume", str(sweep.sweep_dir), "--quiet"]) == 0
    resumed = Sweep.open(sweep.sweep_dir)
    assert [c.status for c in resumed.cells] == ["finished", "finished"]
    assert resumed.cells[0].run_id == run.run_id
    with RunStore(runs / run.run_id / "run.duckdb", read_only=True) as store:
        phases = store.committed_phases(run.run_id)
    assert sorted(phases) == [(1, "collect"), (1, "evaluate"), (1, "select"), (1, "train")]


@pytest.mark.slow
def test_parallel_cells_load_their_models_one_at_a_time_in_a_fresh_process(model_dir, tmp_path):
    """Two cells loading models at once in a process that has not imported transformers yet used to fail."""
    import subprocess
    import sys

    spec_path = tmp_path / "spec.json"
    tiny_spec(model_dir).save(spec_path)
    grid = ["--grid", "preference_replay_mode=current,all_history"]
    command = [sys.executable, "-m", "comlrl_lab.cli", "sweep", str(spec_path), *grid, "--parallel", "2", "--quiet"]
    result = subprocess.run(
        [*command, "--runs-root", str(tmp_path / "runs")], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "2/2 cells finished, 0 failed" in result.stdout


def test_a_cell_labelled_by_people_counts_five_phases_a_round(model_dir, tmp_path):
    spec = tiny_spec(model_dir, num_iterations=2)
    sweep = Sweep.create(spec, {"preference_source": ["reward", "human"]}, seeds=1, runs_root=tmp_path)
    assert [sweep.cell_phases(cell) for cell in sweep.cells] == [2 * 4, 2 * 5]
