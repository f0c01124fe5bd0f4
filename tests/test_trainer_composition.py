"""The four trainers are compositions of a collector and a learner, and every metric they record is declared."""

from __future__ import annotations

import pytest
from trainer_fixtures import ITEMS

from comlrl_lab.names import metric_names
from comlrl_lab.trainers.preference import MADPOIterTrainer, MADPOTrainer, MARLHFIterTrainer, MARLHFTrainer
from comlrl_lab.trainers.preference.base import PreferenceTrainerBase
from comlrl_lab.trainers.preference.madpo import DPOLearner
from comlrl_lab.trainers.preference.marlhf import RLHFLearner
from comlrl_lab.trainers.preference.rounds.collectors import ComparatorCollector, CurrentCollector
from comlrl_lab.trainers.preference.runtime.sink import MemorySink

TRAINERS = (MADPOTrainer, MADPOIterTrainer, MARLHFTrainer, MARLHFIterTrainer)
#: Each algorithm's trainer and the two parts it is made of.
COMPOSITION = {
    "MADPO": (MADPOTrainer, CurrentCollector, DPOLearner),
    "MADPOIter": (MADPOIterTrainer, ComparatorCollector, DPOLearner),
    "MARLHF": (MARLHFTrainer, CurrentCollector, RLHFLearner),
    "MARLHFIter": (MARLHFIterTrainer, ComparatorCollector, RLHFLearner),
}
#: Four items, two of them for evaluation, answers of four tokens.
SETTINGS = dict(train_dataset=ITEMS[:4], eval_dataset=ITEMS[:2], max_new_tokens=4, seed=11)


@pytest.mark.parametrize("trainer_class", TRAINERS)
def test_no_trainer_inherits_another_algorithms_trainer(trainer_class):
    trainers_in_mro = [c for c in trainer_class.__mro__ if issubclass(c, PreferenceTrainerBase)]
    assert trainers_in_mro == [trainer_class, PreferenceTrainerBase]


@pytest.mark.parametrize("kind", COMPOSITION)
def test_each_trainer_is_one_collector_and_one_learner(kind, make_trainer, tmp_path):
    trainer = make_trainer(kind, tmp_path, SETTINGS)
    trainer_class, collector, learner = COMPOSITION[kind]
    assert type(trainer) is trainer_class
    assert type(trainer.collector) is collector and type(trainer.learner) is learner
    assert trainer.collector.context is trainer.context and trainer.learner.context is trainer.context


def _forbid(monkeypatch, owner, what):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{what} ran inside MARLHFIter")

    for name, value in list(vars(owner).items()):
        if callable(value) and not name.startswith("__"):
            monkeypatch.setattr(owner, name, refuse)


def test_marlhf_iter_training_does_not_run_any_madpo_code(make_trainer, tmp_path, monkeypatch):
    """Every method of MADPOIterTrainer and of the DPO learner is made to fail; a MARLHFIter round still runs."""
    _forbid(monkeypatch, MADPOIterTrainer, "MADPOIterTrainer")
    _forbid(monkeypatch, MADPOTrainer, "MADPOTrainer")
    _forbid(monkeypatch, DPOLearner, "DPOLearner")
    sink = MemorySink()
    trainer = make_trainer("MARLHFIter", tmp_path, SETTINGS, sink=sink)
    trainer.train()
    assert trainer.finished
    assert sink.metric(metric_names.BT_LOSS) and sink.metric(metric_names.RL_LOSS)
    assert not sink.metric(metric_names.MADPO_LOSS)


def test_madpo_iter_training_does_not_run_any_marlhf_code(make_trainer, tmp_path, monkeypatch):
    _forbid(monkeypatch, MARLHFIterTrainer, "MARLHFIterTrainer")
    _forbid(monkeypatch, MARLHFTrainer, "MARLHFTrainer")
    _forbid(monkeypatch, RLHFLearner, "RLHFLearner")
    sink = MemorySink()
    trainer = make_trainer("MADPOIter", tmp_path, SETTINGS, sink=sink)
    trainer.train()
    assert trainer.finished and sink.metric(metric_names.MADPO_LOSS)


@pytest.mark.parametrize(
    "kind, overrides",
    [
        ("MADPO", {}),
        ("MADPOIter", {"comparator_policy": "history"}),
        ("MARLHF", {"rl_algorithm": "maac", "reference_kl_enabled": True}),
        ("MARLHFIter", {"rl_algorithm": "iac", "preference_scoring_reward": "reward_model"}),
    ],
)
def test_every_recorded_metric_is_declared_in_metric_names(kind, overrides, make_trainer, tmp_path):
    sink = MemorySink()
    make_trainer(kind, tmp_path, SETTINGS, overrides, sink=sink).train()
    recorded = {m["name"] for records in sink.phases for m in records.metrics}
    undeclared = sorted(n for n in recorded if metric_names.lookup(n) is None)
    assert recorded and not undeclared
    # Catch-all templates are for user callbacks only: nothing a trainer names itself may fall into them.
    caught_all = sorted(n for n in recorded if "{key}" in metric_names.lookup(n).name)
    assert caught_all == []


def test_metric_lookup_and_kinds():
    assert metric_names.name(metric_names.MADPO_AGENT_MARGIN, agent=1) == "madpo/agent_1/margin"
    assert metric_names.lookup("round/madpo/loss").name == metric_names.MADPO_LOSS
    assert metric_names.lookup("rl/critic_0/value_loss").name == metric_names.RL_CRITIC_VALUE_LOSS
    assert metric_names.lookup("rl/my_callback_value").name == metric_names.RL_CALLBACK
    assert metric_names.lookup("eval/pass_rate").name == metric_names.EVAL_AGGREGATED
    assert metric_names.lookup("nothing/like/this") is None
    assert metric_names.kind_of("bt/val_loss") == "bt_loss" and metric_names.kind_of("madpo/loss") == "dpo_loss"
    assert (
        metric_names.kind_of("bt/margin") == "reward_margin" and metric_names.kind_of("madpo/joint_margin") == "margin"
    )
    assert metric_names.kind_of("unknown") == "other"
    assert {m.kind for m in metric_names.METRICS} <= set(metric_names.KINDS)
    assert len({m.name for m in metric_names.METRICS}) == len(metric_names.METRICS)
