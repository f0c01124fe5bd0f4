"""log_reward_distribution: CoMLRL's check at construction, its iteration_NNNN.json files, the store and exports."""

from __future__ import annotations

import json

import duckdb
import pytest
from trainer_fixtures import ITEMS

from comlrl_lab import cli
from comlrl_lab.data.reward_distribution import distribution_payload, distribution_rows
from comlrl_lab.engine.run import STORE_FILE
from comlrl_lab.names import metric_names as M
from comlrl_lab.store import RunStore, export_reward_distribution_files
from comlrl_lab.store.schema import SCHEMA_VERSION
from comlrl_lab.trainers.preference.runtime.sink import MemorySink


def unranged_reward(first, second):
    return [float(len(first) - len(second))]


#: Two MADPOIter rounds on the items prompted as they are, no evaluation, reward distributions logged.
SETTINGS = dict(
    num_iterations=2, eval_dataset=None, formatters=None, eval_interval=0, log_reward_distribution=True, seed=3
)


def test_payload_bins_clip_into_the_range_and_keep_raw_means():
    payload = distribution_payload(
        3, (0.0, 1.0), {"target": [0.0, 0.5, 1.0, 2.0, float("nan")], "comparator": []}, {"target": [0.25]}
    )
    assert payload["iteration"] == 3 and payload["num_bins"] == 16
    assert payload["bin_edges"][:3] == [0.0, 0.0625, 0.125] and payload["bin_edges"][-1] == 1.0
    assert payload["bin_centers"][0] == 0.03125 and len(payload["bin_centers"]) == 16
    target = payload["candidate"]["target"]
    assert target["sample_count"] == 4  # NaN dropped; 2.0 kept and counted in the last bin
    assert target["mean"] == 0.875
    assert target["counts"] == [1] + [0] * 7 + [1] + [0] * 6 + [2]
    assert target["raw_rewards"] == [0.0, 0.5, 1.0, 2.0]
    assert payload["candidate"]["comparator"] == {
        "sample_count": 0,
        "mean": None,
        "counts": [0] * 16,
        "raw_rewards": [],
    }
    assert payload["selected"]["target"]["counts"][4] == 1
    assert distribution_payload(1, (0.0, 1.0), {}, {"target": [float("nan")]}) is None  # nothing finite: no file


def test_log_reward_distribution_needs_a_declared_range_at_construction(make_trainer, tmp_path):
    with pytest.raises(ValueError, match=r"^log_reward_distribution=True requires reward_func\.reward_range"):
        make_trainer("MADPOIter", tmp_path, SETTINGS, reward_func=unranged_reward)
    # not asked: no check
    make_trainer("MADPOIter", tmp_path, SETTINGS, reward_func=unranged_reward, log_reward_distribution=False)


def test_rounds_write_files_store_rows_and_export_them_back(make_trainer, tmp_path):
    sink = MemorySink()
    trainer = make_trainer("MADPOIter", tmp_path, SETTINGS, sink=sink)
    trainer.train()
    folder = tmp_path / "out" / "reward_distributions"
    assert sorted(p.name for p in folder.iterdir()) == ["iteration_0001.json", "iteration_0002.json"]
    first = json.loads((folder / "iteration_0001.json").read_text())
    assert (folder / "iteration_0001.json").read_text().startswith('{\n  "iteration": 1,')  # indent 2, as CoMLRL
    assert list(first) == [
        "iteration", "reward_min", "reward_max", "num_bins", "bin_edges", "bin_centers", "candidate", "selected"
    ]  # fmt: skip
    collected = [r for r in sink.phases if r.phase == "collect" and r.round_index == 1][0]
    current = [c.raw_reward for c in collected.candidates if c.side == "current"]
    assert first["candidate"]["target"]["raw_rewards"] == current
    assert first["candidate"]["target"]["sample_count"] == len(ITEMS) * 3
    assert sum(first["candidate"]["target"]["counts"]) == len(ITEMS) * 3
    selected = [r for r in sink.phases if r.phase == "select" and r.round_index == 1][0]
    assert selected.reward_distributions == distribution_rows(first)
    drawn = [m["value"] for m in selected.metrics if m["name"] == M.TRAIN_PREFERENCE_PAIRS]
    assert drawn[0] > 0 and first["selected"]["target"]["sample_count"] == drawn[0]
    logged = {m["name"]: m["value"] for m in selected.metrics if "reward_distribution/" in m["name"]}
    assert logged["iter/reward_distribution/current_iteration"] == 1
    assert logged["iter/reward_distribution/target_sample_count"] == len(ITEMS) * 3
    assert logged["iter/reward_distribution/target_mean"] == pytest.approx(sum(current) / len(current))
    assert logged["iter/selected_reward_distribution/pair_count"] == drawn[0]
    assert logged["iter/selected_reward_distribution/comparator_sample_count"] == drawn[0]

    (tmp_path / "run").mkdir()
    with RunStore(tmp_path / "run" / STORE_FILE) as store:
        for records in sink.phases:
            store.commit_phase(
                "r1", records.round_index, records.phase, reward_distributions=records.reward_distributions
            )
        frame = store.binned_reward_distributions("r1")
        assert list(zip(frame["round"], frame["series"], frame["side"])) == [
            (r, s, side) for r in (1, 2) for s in ("candidate", "selected") for side in ("current", "comparator")
        ]
        written = export_reward_distribution_files(store, "r1", tmp_path / "export")
    assert [p.name for p in written] == ["iteration_0001.json", "iteration_0002.json"]
    for path in written:
        assert json.loads(path.read_text()) == json.loads((folder / path.name).read_text())
    # The CLI's round-files export writes them next to the round files.
    assert cli.main(["export", str(tmp_path / "run"), "--dest", str(tmp_path / "cli"), "--format", "rounds"]) == 0
    cli_file = tmp_path / "cli" / "reward_distributions" / "iteration_0002.json"
    assert json.loads(cli_file.read_text()) == json.loads((folder / "iteration_0002.json").read_text())


def test_a_version_1_store_gains_the_reward_distributions_table(tmp_path):
    path = tmp_path / "old.duckdb"
    RunStore(path).close()
    con = duckdb.connect(str(path))
    con.execute("DROP TABLE reward_distributions")
    con.execute("ALTER TABLE events DROP COLUMN logged")  # version 3's column: a version-1 store had neither
    con.execute("DROP TABLE labels")  # version 4's table and column
    con.execute("ALTER TABLE rounds DROP COLUMN label_at")
    con.execute("DELETE FROM schema_version")
    con.execute("INSERT INTO schema_version VALUES (1, now()::TIMESTAMP)")
    con.close()
    with RunStore(path) as store:
        versions = store.readonly_sql("SELECT version FROM schema_version ORDER BY version")["version"].tolist()
        assert versions == [1, 2, 3, SCHEMA_VERSION] == [1, 2, 3, 4]  # each step records its version
        assert store.binned_reward_distributions("any").empty
