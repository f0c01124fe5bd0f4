"""Pair construction: known orderings from the reference, ties, unparsed candidates, provenance, determinism."""

from __future__ import annotations

import math
import random

import pytest

from comlrl_lab.data.records import PARSE_UNPARSED, JointCandidate
from comlrl_lab.seeding import RandomStreams
from comlrl_lab.trainers.preference.rounds.collection import reward_summary
from comlrl_lab.trainers.preference.rounds.pairing import base_pairs, iterative_pairs


def candidates(rewards, *, side="current", item=0, raw_offset=100.0, prompt_ids=None):
    """Two-agent joint candidates whose texts and token ids encode (side, index) so copies can be traced."""
    out = []
    for j, r in enumerate(rewards):
        tag = f"{side[:3]}{j}"
        out.append(
            JointCandidate(
                item_index=item,
                candidate_index=j,
                side=side,
                prompts=["p0", "p1"],
                completions=[f"a0-{tag}", f"a1-{tag}"],
                completion_ids=[[j, 1 if side == "current" else 2], [j, 3]],
                prompt_ids=prompt_ids if prompt_ids is not None else [[7, 8], [9]],
                raw_reward=raw_offset + r,
                reward=float(r),
            )
        )
    return out


def indices(pairs):
    return [(p.winner_candidate_index, p.loser_candidate_index) for p in pairs]


# ---------------------------------------------------------------------------------------------- base pairs
def test_base_reward_gap_known_answer():
    pairs = base_pairs(candidates([1, 3, 3, 0]), selection="reward_gap", cap=3, rng=random.Random(0))
    assert indices(pairs) == [(1, 3), (2, 3), (1, 0)]
    assert [p.reward_gap for p in pairs] == [3.0, 3.0, 2.0]


def test_base_all_is_i_j_order_and_uncapped():
    pairs = base_pairs(candidates([1, 3, 3, 0]), selection="all", cap=1, rng=random.Random(0))
    assert indices(pairs) == [(0, 3), (1, 0), (1, 3), (2, 0), (2, 3)]  # the (1,2) tie is dropped


def test_base_ties_dropped_and_all_tied_gives_nothing():
    assert base_pairs(candidates([2, 2, 2]), selection="all", cap=None, rng=random.Random(0)) == []


def test_base_record_fields_and_token_ids():
    pairs = base_pairs(candidates([1, 3, 3, 0]), selection="reward_gap", cap=1, rng=random.Random(0))
    (pair,) = pairs
    assert pair.prompts == ["p0", "p1"]
    assert pair.winner_completions == ["a0-cur1", "a1-cur1"]
    assert pair.loser_completions == ["a0-cur3", "a1-cur3"]
    assert (pair.winner_reward, pair.loser_reward) == (3.0, 0.0)
    assert pair.candidate_reward_mean == pytest.approx(7 / 4)
    assert pair.raw_rewards is None and pair.target_raw_reward is None and pair.comparator_raw_reward is None
    assert pair.winner_side is None and pair.round_index is None and pair.item_index == 0
    assert pair.prompt_ids == [[7, 8], [9]]
    assert pair.winner_ids == [[1, 1], [1, 3]]
    assert pair.loser_ids == [[3, 1], [3, 3]]
    assert pair.to_record()["raw_rewards"] == [] and pair.to_record()["target_raw_reward"] is None


def test_base_token_ids_are_copies():
    cands = candidates([0, 1])
    (pair,) = base_pairs(cands, selection="all", cap=None, rng=random.Random(0))
    pair.winner_ids[0].append(99)
    pair.prompt_ids[0].append(99)
    assert cands[1].completion_ids[0] == [1, 1] and cands[1].prompt_ids[0] == [7, 8]


def test_base_skips_unparsed_and_nan():
    cands = candidates([1, 5, 3, 0])
    cands[1].parse_status = PARSE_UNPARSED
    cands[3].reward = math.nan
    pairs = base_pairs(cands, selection="all", cap=None, rng=random.Random(0))
    assert indices(pairs) == [(2, 0)]
    assert pairs[0].candidate_reward_mean == pytest.approx(2.0)  # mean of the parsed, scored ones


def test_base_random_uses_rng_and_is_deterministic():
    cands = candidates([0, 1, 2, 3, 4, 5])
    a = base_pairs(cands, selection="random", cap=6, rng=RandomStreams(7).python("pairs"))
    b = base_pairs(cands, selection="random", cap=6, rng=RandomStreams(7).python("pairs"))
    assert indices(a) == indices(b) and len(a) == 6
    everything = indices(base_pairs(cands, selection="all", cap=None, rng=random.Random(0)))
    assert set(indices(a)) <= set(everything)
    expected = list(everything)
    random.Random(RandomStreams(7).stream_seed("pairs")).shuffle(expected)
    assert indices(a) == expected[:6]


# ----------------------------------------------------------------------------------------- iterative pairs
CURRENT = [1, 5, 2, 2, 0, 3]
COMPARATOR = [3, 1, 2, 4, 4, 3, 9]


def iter_pairs(selection, cap=None, rng=None, **kwargs):
    return iterative_pairs(
        candidates(CURRENT, **kwargs),
        candidates(COMPARATOR, side="comparator", raw_offset=200.0),
        selection=selection,
        cap=cap,
        rng=rng or random.Random(0),
        round_index=3,
    )


def js(pairs):
    return [p.winner_candidate_index for p in pairs]


def test_iterative_known_orderings():
    assert js(iter_pairs("comparator_reward", cap=None)) == [4, 3, 0, 1]
    assert js(iter_pairs("reward_gap", cap=None)) == [1, 4, 0, 3]
    assert js(iter_pairs("all")) == [0, 1, 3, 4]
    assert js(iter_pairs("comparator_reward", cap=2)) == [4, 3]
    assert js(iter_pairs("all", cap=2)) == [0, 1, 3, 4]  # "all" is never capped


def test_iterative_record_fields():
    pairs = {p.winner_candidate_index: p for p in iter_pairs("all")}
    comparator_wins, current_wins = pairs[4], pairs[1]

    assert comparator_wins.winner_side == "comparator"
    assert comparator_wins.winner_completions == ["a0-com4", "a1-com4"]
    assert comparator_wins.loser_completions == ["a0-cur4", "a1-cur4"]
    assert (comparator_wins.winner_reward, comparator_wins.loser_reward) == (4.0, 0.0)
    assert comparator_wins.raw_rewards == [204.0, 100.0]
    assert comparator_wins.target_raw_reward == 100.0 and comparator_wins.comparator_raw_reward == 204.0
    assert comparator_wins.winner_ids == [[4, 2], [4, 3]] and comparator_wins.loser_ids == [[4, 1], [4, 3]]

    assert current_wins.winner_side == "current"
    assert current_wins.raw_rewards == [105.0, 201.0]
    assert current_wins.target_raw_reward == 105.0 and current_wins.comparator_raw_reward == 201.0
    for pair in pairs.values():
        assert pair.prompts == ["p0", "p1"] and pair.prompt_ids == [[7, 8], [9]]
        assert pair.round_index == 3 and pair.item_index == 0
        assert pair.winner_candidate_index == pair.loser_candidate_index
        # mean over all N current and M comparator processed rewards
        assert pair.candidate_reward_mean == pytest.approx((sum(CURRENT) + sum(COMPARATOR)) / 13)


def test_iterative_unparsed_and_missing_indices():
    current = candidates(CURRENT)
    comparator = candidates(COMPARATOR, side="comparator")
    comparator[4].parse_status = PARSE_UNPARSED
    del current[3]  # index 3 missing on the current side
    pairs = iterative_pairs(current, comparator, selection="all", cap=None, rng=random.Random(0), round_index=1)
    # window = min(5, 7) = 5 -> j in 0..4; j=3 missing, j=4 unparsed
    assert js(pairs) == [0, 1]
    parsed = [r for k, r in enumerate(CURRENT) if k != 3] + [r for k, r in enumerate(COMPARATOR) if k != 4]
    assert pairs[0].candidate_reward_mean == pytest.approx(sum(parsed) / len(parsed))


def test_iterative_drops_token_ids_when_tokenisations_differ():
    pairs = iterative_pairs(
        candidates(CURRENT),
        candidates(COMPARATOR, side="comparator", prompt_ids=[[1], [2]]),
        selection="all",
        cap=None,
        rng=random.Random(0),
        round_index=1,
    )
    assert pairs and all(not p.has_token_ids for p in pairs)


def test_iterative_random_same_seed_same_pairs():
    a = iter_pairs("random", cap=3, rng=RandomStreams(11).python("pairs"))
    b = iter_pairs("random", cap=3, rng=RandomStreams(11).python("pairs"))
    assert [p.to_record() for p in a] == [p.to_record() for p in b]
    assert js(a) == js(b) and len(a) == 3 and set(js(a)) <= {0, 1, 3, 4}


def test_reward_summary_stratified_sem_of_a_hand_made_table():
    # Item 0 drew 0.0 and 0.2, item 1 drew 1.0 and 0.8, item 2 one sample 0.5; an unparsed sample is left out.
    table = candidates([0.0, 0.2], item=0) + candidates([1.0, 0.8], item=1) + candidates([0.5], item=2)
    table.append(candidates([0.9], item=2)[0])
    table[-1].parse_status = PARSE_UNPARSED
    # Within-item variances s_0^2 = s_1^2 = 0.02 (n-1 = 1), so m_i s_i^2 = 0.04 each; item 2 gets the pooled
    # variance (0.02 + 0.02) / (1 + 1) = 0.02. SE = sqrt(0.04 + 0.04 + 0.02) / 5.
    mean, sem, n = reward_summary(table, stratified=True)
    assert (mean, n) == (pytest.approx(0.5), 5)
    assert sem == pytest.approx(math.sqrt(0.10) / 5)
    # Taken as independent draws, the spread between items counts too: sample std of all five over sqrt(5).
    values = [0.0, 0.2, 1.0, 0.8, 0.5]
    iid = math.sqrt(sum((v - 0.5) ** 2 for v in values) / 4 / 5)
    assert reward_summary(table) == (pytest.approx(0.5), pytest.approx(iid), 5)
    assert iid > 2 * sem


def test_reward_summary_stratified_needs_two_samples_of_some_item():
    mean, sem, n = reward_summary(candidates([0.3], item=0) + candidates([0.7], item=1), stratified=True)
    assert (mean, n) == (pytest.approx(0.5), 2) and math.isnan(sem)
