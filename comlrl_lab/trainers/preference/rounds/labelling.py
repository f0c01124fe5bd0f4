"""The label phase of a run whose preferences come from people or a judge model (``preference_source``).

Between collect and select, a ``Labeller`` gathers the verdicts on the round's comparisons (the pairs collect made,
in the reward function's order, each with its blinded ``a_side``):

* ``human``: the verdicts people gave (the Pairs page's labelling view, ``comlrl-lab labels import``), read through
  the trainer's sink. Until every comparison has ``labels_per_comparison`` of them the phase raises
  ``AwaitingLabels`` before it changes anything, so the round waits at its label phase and a later step (a resume,
  the Rounds page's Run) tries again.
* ``judge``: the judge model's verdicts (``judge.py``), asked now; they go into the phase's records and so into the
  store's labels table with the phase.

Either way the phase records how far the verdicts agree with the reward function and between labellers. The select
phase then builds the round's pairs from them (``data.labels.labelled_pairs``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from comlrl_lab.data.labels import (
    A_SIDE_KEY,
    AwaitingLabels,
    Label,
    NoUsableLabels,
    agreement,
    blind_order,
    people_left_nothing,
    waiting,
)
from comlrl_lab.data.records import PreferencePair
from comlrl_lab.names import metric_names as M
from comlrl_lab.trainers.preference.rounds.context import PartContext
from comlrl_lab.trainers.preference.rounds.judge import Judge
from comlrl_lab.trainers.preference.runtime.sink import PhaseRecords

BLIND_STREAM = "blind"


def blind(context: PartContext, comparisons: Sequence[PreferencePair]) -> None:
    """Record each comparison's shown order (which stored side is A), drawn from the run's seeded blind stream."""
    for pair, side in zip(comparisons, blind_order(context.streams.python(BLIND_STREAM), len(comparisons))):
        pair.extra[A_SIDE_KEY] = side


class Labeller:
    """Gathers one round's verdicts: people's through ``given`` (the sink's ``labels``) or the judge's."""

    def __init__(self, context: PartContext, given: Callable[[int], list[Label]]):
        self.context = context
        self.given = given
        self.source = context.config.preference_source
        # Built now, so a judge key that is not set is refused before any work, not after the first collect.
        self._judge: Judge | None = Judge(context.config) if self.source == "judge" else None

    def label(self, comparisons: Sequence[PreferencePair], records: PhaseRecords, step: int) -> list[Label]:
        round_index = records.round_index
        config = self.context.config
        keys = [(round_index, index) for index in range(len(comparisons))]
        metrics: dict[str, float] = {M.LABEL_COMPARISONS: len(comparisons)}
        if self.source == "human":
            self.context.control.begin(round_index, "label", len(comparisons))
            mine = set(keys)
            labels = [label for label in self.given(round_index) if label.key in mine]
            needed = int(config.labels_per_comparison)
            missing = waiting(keys, labels, needed)
            if missing:
                raise AwaitingLabels(round_index, len(missing), len(keys), needed)
            self.context.control.advance(len(comparisons))
            if comparisons and not any(label.preferred for label in labels):
                raise NoUsableLabels(people_left_nothing(round_index, len(comparisons), labels))
        else:
            self.context.control.begin(round_index, "label", 2 * len(comparisons))
            asked = self.judge().ask(
                round_index, list(comparisons), progress=lambda done, total: self.context.control.advance(1)
            )
            labels = records.labels = asked.labels
            metrics.update(
                {
                    M.JUDGE_VERDICTS: len(asked.labels),
                    M.JUDGE_INCONSISTENT: asked.inconsistent,
                    M.JUDGE_UNPARSEABLE: asked.unparseable,
                }
            )
            if comparisons and not any(label.preferred for label in labels):
                raise NoUsableLabels(self.judge().nothing_usable(round_index, asked, len(comparisons)))
            dropped = asked.inconsistent + asked.unparseable
            if dropped:
                records.add_event(
                    "info",
                    f"round {round_index}: the judge answered {asked.inconsistent} comparisons differently in the two "
                    f"orders and {asked.unparseable} unparseably; they are dropped",
                )
        found = agreement(dict(zip(keys, comparisons)), labels, int(config.labels_per_comparison))
        metrics.update(
            {
                M.LABEL_COUNT: found.labels,
                M.LABEL_KAPPA_VS_REWARD: found.vs_reward_kappa,
                M.LABEL_AGREEMENT_VS_REWARD: found.vs_reward_percent / 100.0,
            }
        )
        if found.labellers >= 2:
            metrics.update(
                {M.LABEL_FLEISS_KAPPA: found.between_fleiss, M.LABEL_KRIPPENDORFF_ALPHA: found.between_alpha}
            )
        records.add_metrics(step, {name: value for name, value in metrics.items() if not _nan(value)})
        for name, (count, kappa, percent) in found.per_labeller.items():
            records.add_event(
                "info",
                f"round {round_index}: {name} agrees with the reward function on {percent:.0f}% of {count} "
                f"comparisons (Cohen's kappa {kappa:.2f})",
            )
        return labels

    def judge(self) -> Judge:
        """The judge's client (it reads the key from the environment when it is built, with the trainer)."""
        if self._judge is None:
            self._judge = Judge(self.context.config)
        return self._judge


def _nan(value: float) -> bool:
    return isinstance(value, float) and math.isnan(value)
