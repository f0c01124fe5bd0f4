"""Labels -> pairs and agreement figures, with known answers worked by hand or taken from published examples."""

from __future__ import annotations

import math
import random

import pytest

from comlrl_lab.data.agreement import cohen_kappa, fleiss_kappa, krippendorff_alpha_nominal, percent_agreement
from comlrl_lab.data.labels import (
    Label,
    agreement,
    blind_order,
    check_verdict,
    decide,
    labelled_pairs,
    shown_sides,
    waiting,
)
from comlrl_lab.data.records import PreferencePair


def comparison(i: int, winner_reward: float, loser_reward: float, a_side: str = "winner") -> PreferencePair:
    return PreferencePair(
        prompts=[f"p{i}"],
        winner_completions=[f"w{i}"],
        loser_completions=[f"l{i}"],
        winner_reward=winner_reward,
        loser_reward=loser_reward,
        candidate_reward_mean=(winner_reward + loser_reward) / 2,
        raw_rewards=[winner_reward, loser_reward],
        round_index=1,
        item_index=i,
        winner_candidate_index=0,
        loser_candidate_index=1,
        winner_side="current",
        prompt_ids=[[1]],
        winner_ids=[[10 + i]],
        loser_ids=[[20 + i]],
        extra={"a_side": a_side},
    )


def label(i: int, verdict: str, a_side: str = "winner", who: str = "ann") -> Label:
    return Label(round=1, pair_index=i, labeller=who, verdict=verdict, a_side=a_side)


# ---- labels -> pairs ---------------------------------------------------------------------------------------------


def test_labels_make_pairs_winner_is_the_labelled_side_ties_and_both_bad_dropped():
    comps = [
        comparison(0, 3.0, 1.0, "winner"),  # A = stored winner; verdict A -> stored winner wins
        comparison(1, 3.0, 1.0, "loser"),  # A = stored loser; verdict A -> the reward's loser wins (overruled)
        comparison(2, 2.0, 2.0, "winner"),  # reward tie; verdict B -> stored loser wins
        comparison(3, 5.0, 0.0, "winner"),  # tie -> dropped
        comparison(4, 5.0, 0.0, "loser"),  # both bad -> dropped
        comparison(5, 1.0, 0.0, "winner"),  # unlabelled -> dropped
    ]
    labels = [
        label(0, "A", "winner"),
        label(1, "A", "loser"),
        label(2, "B", "winner"),
        label(3, "tie"),
        label(4, "both_bad", "loser"),
    ]
    out = labelled_pairs(comps, 1, labels)
    assert (out.kept, out.dropped, out.overruled) == (3, 3, 2)
    assert [p.winner_completions for p in out.pairs] == [["w0"], ["l1"], ["l2"]]
    assert [p.loser_completions for p in out.pairs] == [["l0"], ["w1"], ["w2"]]
    # The reward function's values stay with their sides, so overruling it gives a negative gap.
    assert [(p.winner_reward, p.loser_reward) for p in out.pairs] == [(3.0, 1.0), (1.0, 3.0), (2.0, 2.0)]
    flipped = out.pairs[1]
    assert (flipped.winner_ids, flipped.loser_ids) == ([[21]], [[11]])
    assert flipped.raw_rewards == [1.0, 3.0]
    assert flipped.winner_side == "comparator"
    assert (flipped.winner_candidate_index, flipped.loser_candidate_index) == (1, 0)
    assert flipped.extra["labels"] == [{"labeller": "ann", "verdict": "A"}]
    # The comparisons themselves are untouched.
    assert comps[1].winner_completions == ["w1"] and "labels" not in comps[1].extra


def test_several_labels_need_a_strict_majority():
    votes = {
        "two of three": (["A", "A", "tie"], "winner"),
        "split": (["A", "B", "tie"], None),
        "half is not more than half": (["A", "B"], None),
        "both bad majority": (["both_bad", "both_bad", "A"], None),
        "three of four": (["B", "B", "B", "A"], "loser"),
    }
    for name, (verdicts, expected) in votes.items():
        labels = [label(0, v, "winner", who=f"r{k}") for k, v in enumerate(verdicts)]
        assert decide(labels) == expected, name


def test_waiting_counts_labels_per_comparison():
    keys = [(1, 0), (1, 1), (1, 2)]
    labels = [label(0, "A", who="a"), label(0, "B", who="b"), label(1, "tie", who="a")]
    assert waiting(keys, labels, 1) == [(1, 2)]
    assert waiting(keys, labels, 2) == [(1, 1), (1, 2)]


def test_verdict_spellings_and_refusal():
    assert [check_verdict(v) for v in ("A", "b", "Tie", "both bad", "both-bad", "BOTH_BAD")] == [
        "A", "B", "tie", "both_bad", "both_bad", "both_bad"
    ]  # fmt: skip
    with pytest.raises(ValueError, match="verdict must be one of A, B, tie, both_bad, got 'C'"):
        check_verdict("C")


def test_blind_order_is_seeded_and_shown_sides_follow_it():
    first = blind_order(random.Random(7), 20)
    assert first == blind_order(random.Random(7), 20)
    assert set(first) == {"winner", "loser"}
    assert shown_sides(comparison(0, 1.0, 0.0, "loser")) == (["l0"], ["w0"])
    assert shown_sides(comparison(0, 1.0, 0.0, "winner")) == (["w0"], ["l0"])


# ---- agreement: published worked examples ---------------------------------------------------------------------


def test_cohen_kappa_wikipedia_example():
    # Wikipedia, "Cohen's kappa", simple example: 50 grant proposals, Yes/Yes 20, Yes/No 5, No/Yes 10, No/No 15:
    # p_o = 0.7, p_e = 0.5, kappa = 0.4.
    a = ["yes"] * 25 + ["no"] * 25
    b = ["yes"] * 20 + ["no"] * 5 + ["yes"] * 10 + ["no"] * 15
    assert percent_agreement(a, b) == pytest.approx(0.7)
    assert cohen_kappa(a, b) == pytest.approx(0.4)
    assert math.isnan(cohen_kappa(["x", "x"], ["x", "x"]))  # chance agreement is already perfect
    assert math.isnan(cohen_kappa([], []))


def test_fleiss_kappa_wikipedia_example():
    # Wikipedia, "Fleiss' kappa", worked example: 10 subjects, 14 raters, 5 categories; P = 0.378, P_e = 0.213,
    # kappa = 0.210.
    table = [
        [0, 0, 0, 0, 14],
        [0, 2, 6, 4, 2],
        [0, 0, 3, 5, 6],
        [0, 3, 9, 2, 0],
        [2, 2, 8, 1, 1],
        [7, 7, 0, 0, 0],
        [3, 2, 6, 3, 0],
        [2, 5, 3, 2, 2],
        [6, 5, 2, 1, 0],
        [0, 2, 2, 3, 7],
    ]
    assert fleiss_kappa(table) == pytest.approx(0.20993, abs=1e-4)
    with pytest.raises(ValueError, match="same number"):
        fleiss_kappa([[1, 1], [2, 1]])


def test_krippendorff_alpha_nominal_published_example():
    # Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C: 4 observers, 12 units, missing
    # values; nominal alpha = 0.743.
    observers = [
        [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
        [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
        [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
        [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
    ]
    units = [[row[u] for row in observers if row[u] is not None] for u in range(12)]
    assert krippendorff_alpha_nominal(units) == pytest.approx(0.743, abs=5e-4)


def test_agreement_of_labels_with_the_reward_and_between_labellers():
    # Four comparisons; the reward prefers the stored winner in 0-2 and ties in 3. Ann: winner, winner, loser,
    # none; Bob: winner, loser, loser, none. Against the reward (winner, winner, winner, none):
    # Ann agrees on 0, 1, 3 -> 75 %; Bob on 0, 3 -> 50 %.
    comps = {(1, i): comparison(i, *rewards) for i, rewards in enumerate([(2, 1), (2, 1), (2, 1), (1, 1)])}
    labels = [
        label(0, "A", who="ann"), label(1, "A", who="ann"), label(2, "B", who="ann"), label(3, "tie", who="ann"),
        label(0, "A", who="bob"), label(1, "B", who="bob"), label(2, "B", who="bob"), label(3, "both_bad", who="bob"),
    ]  # fmt: skip
    found = agreement(comps, labels, raters=2)
    assert (found.labels, found.labellers) == (8, 2)
    assert found.per_labeller["ann"][2] == pytest.approx(75.0)
    assert found.per_labeller["bob"][2] == pytest.approx(50.0)
    # Ann vs reward by hand: categories (w, w, l, n) against (w, w, w, n): p_o = 3/4,
    # p_e = (2/4 * 3/4) + (1/4 * 0) + (1/4 * 1/4) = 7/16, kappa = (12/16 - 7/16) / (9/16) = 5/9.
    assert found.per_labeller["ann"][1] == pytest.approx(5 / 9)
    assert found.vs_reward_percent == pytest.approx(62.5)
    # Between the two: units (w, w), (w, l), (l, l), (n, n). Fleiss by hand: P_i = 1, 0, 1, 1 -> P = 3/4; shares
    # w 3/8, l 3/8, n 2/8 -> P_e = 22/64; kappa = (3/4 - 22/64) / (1 - 22/64) = 26/42.
    assert found.between_fleiss == pytest.approx(26 / 42)
    # Krippendorff: n = 8 values, o(w,l) = o(l,w) = 1; totals w 3, l 3, n 2 -> chance pairs 2*(9 + 6 + 6) = 42;
    # alpha = 1 - 7 * 2 / 42 = 2/3.
    assert found.between_alpha == pytest.approx(2 / 3)
