"""Labels of comparisons: verdicts, blinding, the pairs a round's labels make, and agreement figures.

A comparison is one pair the collect phase made (``round``, ``pair_index``), stored with the reward function's
orientation: its ``winner`` side has the higher (or, on a tie, equal) reward. People and the judge see its two
sides as A and B in a seeded random order, recorded as ``a_side`` ("winner" or "loser": which stored side was shown
as A), and give one of four verdicts (Chatbot Arena's): A, B, tie or both bad. A verdict read against ``a_side``
is a preference for a stored side: "winner", "loser" or none.

The labelled pair's winner is the side more than half of the comparison's labels prefer; a comparison without
such a side (ties, both bad, a split) is dropped, as the reward function's ties are. The pair keeps the reward
function's values with their sides, so a labeller who overrules the reward gives a pair with a negative reward gap.
This module does no I/O and imports no torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from comlrl_lab.data.agreement import cohen_kappa, fleiss_kappa, krippendorff_alpha_nominal, percent_agreement
from comlrl_lab.data.records import PreferencePair

#: The four verdicts, as stored; the labelling view's keys 1 2 3 4 give them in this order.
VERDICTS: tuple[str, ...] = ("A", "B", "tie", "both_bad")
SIDES: tuple[str, ...] = ("winner", "loser")
A_SIDE_KEY = "a_side"  # in a comparison's ``extra``: which stored side is shown as A


HOW_TO_LABEL = (
    "label them in the workbench (Pairs page, Label tab), or export them with `comlrl-lab labels export RUN_DIR` and "
    "import the verdicts with `comlrl-lab labels import RUN_DIR FILE`; then resume the run"
)


class AwaitingLabels(RuntimeError):
    """The round's comparisons do not all have their labels yet; nothing ran and the cursor stays at ``label``."""

    def __init__(self, round_index: int, missing: int, total: int, needed: int):
        self.round_index, self.missing, self.total, self.needed = round_index, missing, total, needed
        each = "a label" if needed == 1 else f"{needed} labels"
        super().__init__(
            f"round {round_index} waits for labels: {missing} of {total} comparisons still need {each}; {HOW_TO_LABEL}"
        )


class NoUsableLabels(RuntimeError):
    """A round's label phase ended with no verdict that prefers a side: select would train on nothing, so the run
    stops (nothing of the phase committed) with one line naming who labelled, the counts and the likely cause."""


def people_left_nothing(round_index: int, comparisons: int, labels: Sequence[Label]) -> str:
    """The ``NoUsableLabels`` line of a round whose people's labels all say tie or both bad."""
    names = sorted({label.labeller for label in labels})
    ties = sum(label.verdict == "tie" for label in labels)
    return (
        f"round {round_index}: the labels of {', '.join(repr(n) for n in names) or 'nobody'} leave no usable label: "
        f"{len(labels)} labels on {comparisons} comparisons, {ties} tie and {len(labels) - ties} both bad, none "
        "prefers a side, so select would train on nothing; relabel some comparisons (Pairs page, Label tab, or "
        "`comlrl-lab labels import`), then resume the run"
    )


@dataclass(frozen=True)
class Label:
    """One labeller's verdict on one comparison, with the order it was shown in."""

    round: int
    pair_index: int
    labeller: str
    verdict: str
    a_side: str
    labelled_at: datetime | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.round, self.pair_index)

    @property
    def preferred(self) -> str | None:
        """The stored side this verdict prefers, or None (tie, both bad)."""
        return preferred_side(self.verdict, self.a_side)


def check_verdict(verdict: Any) -> str:
    """``verdict`` as stored; "both bad", "both-bad" and any case are read as both_bad. ValueError otherwise."""
    text = str(verdict).strip()
    folded = text.lower().replace("-", "_").replace(" ", "_")
    for canonical in VERDICTS:
        if folded == canonical.lower():
            return canonical
    raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, got {verdict!r}")


def check_side(a_side: Any) -> str:
    if a_side not in SIDES:
        raise ValueError(f"a_side must be one of {', '.join(SIDES)}, got {a_side!r}")
    return str(a_side)


def other_side(side: str) -> str:
    return "loser" if side == "winner" else "winner"


def preferred_side(verdict: str, a_side: str) -> str | None:
    if verdict == "A":
        return a_side
    if verdict == "B":
        return other_side(a_side)
    return None


def blind_order(rng: Any, count: int) -> list[str]:
    """``count`` shown orders, one per comparison, from ``rng`` (a seeded ``random.Random``)."""
    return [SIDES[rng.randrange(2)] for _ in range(count)]


def shown_sides(pair: PreferencePair) -> tuple[list[str], list[str]]:
    """The completions shown as A and as B, in the comparison's recorded order."""
    if pair.extra.get(A_SIDE_KEY, "winner") == "winner":
        return list(pair.winner_completions), list(pair.loser_completions)
    return list(pair.loser_completions), list(pair.winner_completions)


def joint_text(parts: list[str]) -> str:
    """A joint response (or several agents' prompts) as one text: one agent's as it is, several numbered."""
    if len(parts) == 1:
        return parts[0]
    return "\n".join(f"[Agent {i + 1}]\n{text}" for i, text in enumerate(parts))


def comparison_texts(pair: PreferencePair) -> tuple[str, str, str]:
    """The comparison as people see it: (prompt, response A, response B), each joint text as ``joint_text`` makes it."""
    a, b = shown_sides(pair)
    return joint_text(list(dict.fromkeys(pair.prompts))), joint_text(a), joint_text(b)


def comparison_fingerprint(pair: PreferencePair) -> str:
    """A short fingerprint of the comparison's texts as shown (prompt, A, B): a label carries it, so a label can only
    land on the comparison it was given for. ``fp-`` and 16 hex digits, never read as a number by a spreadsheet."""
    digest = hashlib.sha256(json.dumps(comparison_texts(pair), ensure_ascii=False).encode("utf-8")).hexdigest()
    return f"fp-{digest[:16]}"


def reward_preference(pair: PreferencePair) -> str | None:
    """The stored side the reward function prefers: "winner", or None on a tie (or without rewards)."""
    gap = float(pair.winner_reward) - float(pair.loser_reward)
    return "winner" if gap > 0 else ("loser" if gap < 0 else None)


def group_labels(labels: Iterable[Label]) -> dict[tuple[int, int], list[Label]]:
    grouped: dict[tuple[int, int], list[Label]] = defaultdict(list)
    for label in labels:
        grouped[label.key].append(label)
    return dict(grouped)


def decide(labels: Sequence[Label]) -> str | None:
    """The side more than half of ``labels`` prefer, or None (ties, both bad, a split, no labels)."""
    votes = [label.preferred for label in labels]
    for side in SIDES:
        if votes.count(side) * 2 > len(votes):
            return side
    return None


def waiting(comparisons: Sequence[tuple[int, int]], labels: Iterable[Label], needed: int) -> list[tuple[int, int]]:
    """The comparisons (round, pair_index) with fewer than ``needed`` labels, in order."""
    grouped = group_labels(labels)
    return [key for key in comparisons if len(grouped.get(key, ())) < needed]


def oriented(pair: PreferencePair, side: str) -> PreferencePair:
    """``pair`` with stored side ``side`` as its winner: texts, token ids, rewards and provenance swapped when
    ``side`` is "loser"; the sides keep their own reward function values."""
    if side == "winner":
        return dataclasses.replace(pair, extra=dict(pair.extra))
    flip = {"current": "comparator", "comparator": "current"}
    return dataclasses.replace(
        pair,
        winner_completions=list(pair.loser_completions),
        loser_completions=list(pair.winner_completions),
        winner_reward=pair.loser_reward,
        loser_reward=pair.winner_reward,
        raw_rewards=None if pair.raw_rewards is None else list(reversed(pair.raw_rewards)),
        winner_candidate_index=pair.loser_candidate_index,
        loser_candidate_index=pair.winner_candidate_index,
        winner_side=None if pair.winner_side is None else flip[pair.winner_side],  # type: ignore[arg-type]
        winner_ids=pair.loser_ids,
        loser_ids=pair.winner_ids,
        reference_winner_logps=pair.reference_loser_logps,
        reference_loser_logps=pair.reference_winner_logps,
        extra=dict(pair.extra),
    )


@dataclass
class LabelledRound:
    """What one round's labels made: the pairs to train on, and how many comparisons went which way."""

    pairs: list[PreferencePair]
    kept: int = 0
    overruled: int = 0  # kept with the side the reward function ranked lower (or equal) as the winner
    dropped: int = 0  # ties, both bad, split votes


def labelled_pairs(comparisons: Sequence[PreferencePair], round_index: int, labels: Iterable[Label]) -> LabelledRound:
    """The round's pairs from its labels: comparison ``pair_index`` (its position in ``comparisons``) becomes a pair
    oriented to the side its labels prefer; one without a preferred side is dropped. Each pair's ``extra`` keeps its
    labels (labeller, verdict) and the stored side the reward function preferred."""
    grouped = group_labels(labels)
    out = LabelledRound(pairs=[])
    for index, comparison in enumerate(comparisons):
        mine = grouped.get((round_index, index), [])
        side = decide(mine)
        if side is None:
            out.dropped += 1
            continue
        pair = oriented(comparison, side)
        pair.extra["labels"] = [{"labeller": label.labeller, "verdict": label.verdict} for label in mine]
        pair.extra["comparison_index"] = index
        out.kept += 1
        out.overruled += int(reward_preference(comparison) != side)
        out.pairs.append(pair)
    return out


# ---- agreement ---------------------------------------------------------------------------------------------------


def _category(side: str | None) -> str:
    return side or "none"


@dataclass
class Agreement:
    """Agreement figures of a set of labels; nan where a figure is undefined."""

    labels: int
    labellers: int
    vs_reward_kappa: float  # Cohen's kappa, every label against the reward function's preference
    vs_reward_percent: float  # 0..100
    between_fleiss: float  # over comparisons with exactly ``raters`` labels, when raters >= 2
    between_alpha: float  # Krippendorff's alpha (nominal), every comparison with two or more labels
    per_labeller: dict[str, tuple[int, float, float]]  # labeller -> (labels, kappa, percent) against the reward


def agreement(comparisons: dict[tuple[int, int], PreferencePair], labels: Iterable[Label], raters: int) -> Agreement:
    """Labellers against the reward function and against each other. A verdict counts as the side it prefers
    ("winner", "loser") or "none" (tie and both bad: the reward function cannot say both are bad)."""
    labels = [label for label in labels if label.key in comparisons]
    mine: list[str] = []
    reward: list[str] = []
    by_labeller: dict[str, tuple[list[str], list[str]]] = defaultdict(lambda: ([], []))
    for label in labels:
        said, truth = _category(label.preferred), _category(reward_preference(comparisons[label.key]))
        mine.append(said)
        reward.append(truth)
        by_labeller[label.labeller][0].append(said)
        by_labeller[label.labeller][1].append(truth)
    grouped = group_labels(labels)
    units = [[_category(label.preferred) for label in group] for group in grouped.values()]
    fleiss = math.nan
    if raters >= 2:
        full = [unit for unit in units if len(unit) == raters]
        if full:
            table = [[unit.count(c) for c in ("winner", "loser", "none")] for unit in full]
            fleiss = fleiss_kappa(table)
    return Agreement(
        labels=len(labels),
        labellers=len(by_labeller),
        vs_reward_kappa=cohen_kappa(mine, reward),
        vs_reward_percent=100.0 * percent_agreement(mine, reward),
        between_fleiss=fleiss,
        between_alpha=krippendorff_alpha_nominal(units),
        per_labeller={
            name: (len(said), cohen_kappa(said, truth), 100.0 * percent_agreement(said, truth))
            for name, (said, truth) in sorted(by_labeller.items())
        },
    )
