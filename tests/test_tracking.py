"""report_to / wandb_config: W&B (offline) and TensorBoard get each round's metrics, distributions and pairs."""

from __future__ import annotations

import json

import pytest
from trainer_fixtures import ITEMS

from comlrl_lab.names import metric_names as M
from comlrl_lab.trainers.preference import MADPOConfig
from comlrl_lab.trainers.preference.runtime import tracking
from comlrl_lab.trainers.preference.runtime.sink import MemorySink

#: One MADPOIter round on the six items prompted as they are, with its reward distributions logged.
SETTINGS = dict(eval_dataset=ITEMS[:2], formatters=None, log_reward_distribution=True, seed=5)


def test_report_to_names_are_checked_and_normalised():
    assert MADPOConfig(report_to="TensorBoard").report_to == ["tensorboard"]
    assert MADPOConfig(report_to=["wandb", "tensorboard", "wandb"]).report_to == ["wandb", "tensorboard"]
    assert MADPOConfig().report_to is None
    with pytest.raises(
        ValueError, match=r"^report_to entries must be one of: wandb, tensorboard, none; got 'mlflow'\.$"
    ):
        MADPOConfig(report_to=["mlflow"])
    with pytest.raises(ValueError, match=r"^report_to: 'none' cannot be combined with other trackers\.$"):
        MADPOConfig(report_to=["none", "wandb"])
    assert tracking.requested_trackers(None, None) == []
    assert tracking.requested_trackers(None, {"project": "p"}) == ["wandb"]  # CoMLRL: wandb_config turns W&B on
    assert tracking.requested_trackers(["none"], {"project": "p"}) == []


def test_a_missing_tracker_package_fails_at_construction(make_trainer, tmp_path, monkeypatch):
    real = tracking.importlib.util.find_spec
    monkeypatch.setattr(
        tracking.importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ImportError, match=r"report_to includes 'wandb', but the wandb package is not installed"):
        make_trainer("MADPO", tmp_path, report_to=["wandb"])


def test_tensorboard_event_files_hold_scalars_distributions_and_pairs(make_trainer, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = MemorySink()
    make_trainer("MADPOIter", tmp_path, SETTINGS, sink=sink, report_to=["tensorboard"]).train()
    events = EventAccumulator(str(tmp_path / "out" / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    tags = events.Tags()
    pairs_metric = sink.metric(M.CURRENT_PREFERENCE_PAIRS)
    assert [(e.step, e.value) for e in events.Scalars(M.CURRENT_PREFERENCE_PAIRS)] == pairs_metric
    eval_mean = sink.metric(M.EVAL_REWARD_MEAN)
    assert [round(e.value, 5) for e in events.Scalars(M.EVAL_REWARD_MEAN)] == [round(v, 5) for _, v in eval_mean]
    hist = events.Histograms("reward_distribution/candidate/current")
    stored = [
        r for p in sink.phases for r in p.reward_distributions if (r["series"], r["side"]) == ("candidate", "current")
    ]
    assert len(hist) == 1 and hist[0].step == 1
    assert hist[0].histogram_value.num == stored[0]["sample_count"] == len(ITEMS) * 3
    assert list(hist[0].histogram_value.bucket) == [float(c) for c in stored[0]["counts"]]
    assert "pairs/sample/text_summary" in tags["tensors"]


def test_wandb_offline_run_folder_has_the_config_metrics_and_pair_table(make_trainer, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    sink = MemorySink()
    config = {"project": "comlrl-lab-test", "name": "offline-check", "tags": ["t1"], "dir": str(tmp_path / "wb")}
    trainer = make_trainer("MADPOIter", tmp_path, SETTINGS, sink=sink, wandb_config=config)
    assert trainer.trackers.trackers and trainer.trackers.trackers[0].run is None  # nothing starts before a phase
    trainer.train()
    assert trainer.trackers.trackers[0].run is None  # finished with the last phase
    import wandb

    wandb.teardown()  # the wandb-core service writes the offline log; stopping it flushes the file
    runs = sorted((tmp_path / "wb" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1
    # The pair sample is a wandb.Table, written as JSON in the run folder: the collect phase's first pairs.
    (table_file,) = (runs[0] / "files" / "media" / "table" / "pairs").glob("sample_*.table.json")
    table = json.loads(table_file.read_text())
    pairs = sink.pairs(1)
    assert table["columns"] == tracking.PAIR_COLUMNS
    assert [row[1:5] for row in table["data"]] == [
        [p.item_index, p.winner_side, p.winner_reward, p.loser_reward] for p in pairs[: tracking.PAIR_SAMPLE_SIZE]
    ]
    # wandb 0.31 has no Python reader for the offline .wandb log; its protobuf records hold keys and names as
    # plain bytes (this run's log is far below one 32 KiB block, so no record is split).
    log = next(runs[0].glob("run-*.wandb")).read_bytes()
    for text in (
        "comlrl-lab-test",  # project
        "offline-check",  # name
        M.CURRENT_PREFERENCE_PAIRS,  # per-round metrics
        M.MADPO_LOSS,  # per-update metrics
        M.EVAL_REWARD_MEAN,  # evaluation
        "reward_distribution/candidate/current",  # the logged histogram
        "log_reward_distribution",  # the run config
    ):
        assert text.encode() in log, text


def test_a_spec_file_turns_trackers_on_with_its_wandb_config(model_dir, tmp_path):
    from comlrl_lab.engine.spec import ExperimentSpec, build_trainer

    spec = ExperimentSpec.from_dict(
        {
            "algorithm": "MADPO",
            "agent_models": [model_dir, model_dir],
            "config": {"report_to": ["wandb", "tensorboard"], "agent_devices": "cpu"},
            "wandb_config": {"project": "from-spec", "tags": ["a"]},
        }
    )
    assert ExperimentSpec.from_dict(spec.to_dict()) == spec  # spec files keep both
    trainer = build_trainer(spec, output_dir=tmp_path / "run", run_id="r1")
    wandb_tracker, tensorboard_tracker = trainer.trackers.trackers
    assert isinstance(wandb_tracker, tracking.WandbTracker) and wandb_tracker.wandb_config["project"] == "from-spec"
    assert isinstance(tensorboard_tracker, tracking.TensorBoardTracker)
    assert tensorboard_tracker.log_dir == tmp_path / "run" / "tensorboard"
