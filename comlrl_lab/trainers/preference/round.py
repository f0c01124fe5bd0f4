"""One round top to bottom as plain calls: collect, label or judge, select, train, evaluate.

A trainer's ``step()`` runs one phase of a round through ``run_phase`` and commits what it recorded; which
phases a round has comes from ``names.phases`` (``label`` only where people or a judge decide the preferences).
The work of each phase lives in the trainer's parts: its collector (``rounds/``: sampling, pairing, replay,
selection), its labeller (``rounds/labelling.py``, people or a judge) and its learner (``learning/``: MADPO's DPO
updates, or MARLHF's reward model then policy learning). Evaluation is the trainer's own: fresh samples scored by
the task reward. Nothing here commits, checkpoints or advances the cursor: that is ``base.py``'s phase machine.
"""

from __future__ import annotations

from typing import Any

from comlrl_lab.names.phases import LABEL_PHASE
from comlrl_lab.trainers.preference.runtime.sink import PhaseRecords


def run_phase(trainer: Any, phase: str, records: PhaseRecords) -> None:
    """Run ``phase`` of ``trainer``'s current round, writing what it produces into ``records``."""
    if phase == "collect":
        collect(trainer, records)
    elif phase == LABEL_PHASE:
        label(trainer, records)
    elif phase == "select":
        select(trainer, records)
    elif phase == "train":
        train(trainer, records)
    else:
        trainer.evaluate_phase(records)
        return
    if records.events:  # what the collector or learner said last (a warning, "no update"): the progress line
        trainer.last_message = records.events[-1]["message"]


def collect(trainer: Any, records: PhaseRecords) -> None:
    """Sample joint candidates (current agents, and the comparator in iterative runs), score them, form pairs."""
    trainer.collector.collect(records, trainer.updates_seen)
    if trainer.labeller is None:  # the oracle's pairs are the round's pairs
        trainer.learner.on_pairs_collected(trainer.collector.round_pairs)


def label(trainer: Any, records: PhaseRecords) -> None:
    """People or a judge say which side of each comparison is better."""
    collector = trainer.collector
    collector.round_labels = trainer.labeller.label(collector.round_pairs, records, trainer.updates_seen)


def select(trainer: Any, records: PhaseRecords) -> None:
    """Draw the batch B^(nu) this round trains on from the replay buffer."""
    trainer.collector.select(records, trainer.updates_seen)
    if trainer.labeller is not None:  # the round's pairs exist now: the labels chose their winners
        trainer.learner.on_pairs_collected(trainer.collector.labelled_pairs)


def train(trainer: Any, records: PhaseRecords) -> None:
    """Update the agents on the selected pairs (MADPO), or fit the reward model and learn the policy (MARLHF)."""
    trainer.initial_fingerprints()  # the last moment the weights are still the initial ones
    trainer.mark_weights_touched()
    trained = trainer.learner.train(trainer.collector.train_pairs, records, trainer.updates_seen)
    trainer.count_training(trained)
    trainer.collector.after_train(trainer.round_index)
