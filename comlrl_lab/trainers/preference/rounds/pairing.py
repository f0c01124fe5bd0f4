"""Scored joint responses of one task item -> preference pairs; ties dropped; ``pair_selection`` applied.

Two constructions, both per task item (reference section 2):

* ``base_pairs``: every ordered pair (i, j), i != j, of the current policy's joint candidates whose
  processed rewards differ strictly (MADPO, MARLHF).
* ``iterative_pairs``: current joint candidate j against the comparator's joint candidate j, for the indices
  both sides sampled (MADPOIter, MARLHFIter); either side can win.

Candidates that were not parsed (``parse_status != "ok"``) or have a NaN processed reward take part in no
pair. The module does no sampling, scoring or tokenising and does not import torch; its only randomness is
the ``random.Random`` handed in (``RandomStreams.python("pairs")``), used by ``pair_selection="random"``.
``selection`` and ``cap`` come from a validated config (``pair_selection``, ``preference_pairs_per_sample``): they
are not checked again here.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from comlrl_lab.data.records import JointCandidate, PreferencePair


def base_pairs(
    candidates: Sequence[JointCandidate],
    *,
    selection: str,
    cap: int | None,
    rng: random.Random,
    keep_ties: bool = False,
) -> list[PreferencePair]:
    """Within-policy pairs of one task item: candidate i beats j when r_i - r_j > 0 (processed rewards).

    Ordering by ``selection`` (reference 2.2): "reward_gap" is a stable sort by gap, largest first, so equal
    gaps keep generation order (i ascending, then j); "random" shuffles with ``rng``; "all" keeps (i, j) order.
    ``cap`` (``preference_pairs_per_sample``) then keeps the first ``cap`` pairs; "all" is never capped.
    Rewards [1, 3, 3, 0] with cap 3 give (1, 3), (2, 3), (1, 0).

    Winner and loser texts and sampled token ids are copied from the candidates, so a pair trains on exactly
    what was sampled. ``keep_ties`` (comparisons for people or a judge to label, ``preference_source`` human or
    judge) also keeps each tied pair once, as (i, j) with i < j and gap 0: the reward function cannot tell them
    apart, a labeller may.
    """
    ordered = sorted(candidates, key=lambda c: c.candidate_index)
    scored = [c for c in ordered if _usable(c)]
    reward_mean = _mean([c.reward for c in scored])

    # Generation order: i ascending, then j ascending.
    entries: list[tuple[float, JointCandidate, JointCandidate]] = []
    for winner in scored:
        for loser in scored:
            if winner is loser:
                continue
            gap = float(winner.reward) - float(loser.reward)
            tie_kept = keep_ties and gap == 0 and winner.candidate_index < loser.candidate_index
            if gap > 0 or tie_kept:  # strict: ties produce no pair unless they are kept for labelling
                entries.append((gap, winner, loser))

    if selection == "reward_gap":
        entries.sort(key=lambda e: e[0], reverse=True)  # stable: equal gaps keep (i, j) order
    elif selection == "random":
        rng.shuffle(entries)
    if selection != "all" and cap is not None:
        entries = entries[:cap]

    return [_base_pair(winner, loser, reward_mean) for _, winner, loser in entries]


def iterative_pairs(
    current: Sequence[JointCandidate],
    comparator: Sequence[JointCandidate],
    *,
    selection: str,
    cap: int | None,
    rng: random.Random,
    round_index: int | None,
    keep_ties: bool = False,
) -> list[PreferencePair]:
    """Current joint candidate j against comparator joint candidate j, for j < min(N, M) (reference 2.3).

    gap = current reward - comparator reward (processed): gap > 0 -> the current side wins, gap < 0 -> the
    comparator side wins, gap = 0 -> no pair. Orderings: "comparator_reward" sorts by (comparator reward,
    |gap|), largest first, whoever won; "reward_gap" by |gap|, largest first; "all" by j; "random" shuffles
    with ``rng``. All sorts are stable. ``cap`` applies except for "all". Current [1,5,2,2,0,3] against
    comparator [3,1,2,4,4,3,9] gives j = 4, 3, 0, 1 (comparator_reward) and j = 1, 4, 0, 3 (reward_gap).

    ``candidate_reward_mean`` is the mean over the item's parsed current *and* comparator rewards.
    Prompts and ``prompt_ids`` come from the current side; ``round_index`` is the 1-based iteration. ``keep_ties``
    keeps gap-0 comparisons too (for labelling), with the comparator as the stored winner.
    """
    # N and M count every sampled candidate (parsed or not), as the comparison window does in CoMLRL.
    window = min(len(current), len(comparator))
    current_by_index = {c.candidate_index: c for c in current}
    comparator_by_index = {c.candidate_index: c for c in comparator}
    reward_mean = _mean([c.reward for c in (*current, *comparator) if _usable(c)])

    entries: list[tuple[float, float, int, JointCandidate, JointCandidate]] = []  # (|gap|, comp r, j, cur, comp)
    for j in range(window):
        ours, theirs = current_by_index.get(j), comparator_by_index.get(j)
        if ours is None or theirs is None or not (_usable(ours) and _usable(theirs)):
            continue
        gap = float(ours.reward) - float(theirs.reward)
        if gap != 0 or keep_ties:
            entries.append((abs(gap), float(theirs.reward), j, ours, theirs))

    if selection == "comparator_reward":
        entries.sort(key=lambda e: (e[1], e[0]), reverse=True)
    elif selection == "reward_gap":
        entries.sort(key=lambda e: e[0], reverse=True)
    elif selection == "random":
        rng.shuffle(entries)
    if selection != "all" and cap is not None:
        entries = entries[:cap]

    return [_iterative_pair(ours, theirs, reward_mean, round_index) for _, _, _, ours, theirs in entries]


def _base_pair(winner: JointCandidate, loser: JointCandidate, reward_mean: float) -> PreferencePair:
    return PreferencePair(
        prompts=list(winner.prompts),
        winner_completions=list(winner.completions),
        loser_completions=list(loser.completions),
        winner_reward=float(winner.reward),
        loser_reward=float(loser.reward),
        candidate_reward_mean=reward_mean,
        raw_rewards=None,
        target_raw_reward=None,
        comparator_raw_reward=None,
        round_index=None,
        item_index=winner.item_index,
        winner_candidate_index=winner.candidate_index,
        loser_candidate_index=loser.candidate_index,
        winner_side=None,
        prompt_ids=_copy_ids(winner.prompt_ids),
        winner_ids=_copy_ids(winner.completion_ids),
        loser_ids=_copy_ids(loser.completion_ids),
    )


def _iterative_pair(
    ours: JointCandidate, theirs: JointCandidate, reward_mean: float, round_index: int | None
) -> PreferencePair:
    current_wins = float(ours.reward) > float(theirs.reward)
    winner, loser = (ours, theirs) if current_wins else (theirs, ours)
    # Differs from CoMLRL: the sampled token ids are kept instead of re-tokenising the decoded text (its
    # section 8.7). They are only valid for the actors when the comparator's candidates are expressed in the
    # actor's tokenisation of the same prompts; when the prompt ids disagree (another tokenizer, an API or
    # centralized comparator that did not re-tokenise), the ids are left out and the trainer must tokenise text.
    same_tokens = _ids_present(ours) and _ids_present(theirs) and ours.prompt_ids == theirs.prompt_ids
    return PreferencePair(
        prompts=list(ours.prompts),
        winner_completions=list(winner.completions),
        loser_completions=list(loser.completions),
        winner_reward=float(winner.reward),
        loser_reward=float(loser.reward),
        candidate_reward_mean=reward_mean,
        raw_rewards=[float(winner.raw_reward), float(loser.raw_reward)],
        target_raw_reward=float(ours.raw_reward),
        comparator_raw_reward=float(theirs.raw_reward),
        round_index=round_index,
        item_index=ours.item_index,
        winner_candidate_index=winner.candidate_index,
        loser_candidate_index=loser.candidate_index,
        winner_side="current" if current_wins else "comparator",
        prompt_ids=_copy_ids(ours.prompt_ids) if same_tokens else None,
        winner_ids=_copy_ids(winner.completion_ids) if same_tokens else None,
        loser_ids=_copy_ids(loser.completion_ids) if same_tokens else None,
    )


def _usable(candidate: JointCandidate) -> bool:
    return candidate.parsed and not math.isnan(float(candidate.reward))


def _ids_present(candidate: JointCandidate) -> bool:
    return candidate.prompt_ids is not None and candidate.completion_ids is not None


def _copy_ids(ids: list[list[int]] | None) -> list[list[int]] | None:
    return None if ids is None else [list(agent_ids) for agent_ids in ids]


def _mean(values: Sequence[float]) -> float:
    return math.fsum(float(v) for v in values) / len(values) if values else math.nan
