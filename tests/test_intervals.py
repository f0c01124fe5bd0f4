"""Confidence intervals over runs (ui/intervals.py) against answers worked out by hand."""

from __future__ import annotations

import math

import pytest

from comlrl_lab.ui.intervals import PAIRED, WELCH, difference, mean_interval, paired_difference, welch_difference


def test_a_group_mean_has_a_student_t_interval():
    # mean 0.6, s = 0.1, n = 3: t(0.975, 2) = 4.303, half-width 4.303 * 0.1 / sqrt(3) = 0.24843
    interval = mean_interval([0.5, 0.6, 0.7])
    assert interval.mean == pytest.approx(0.6) and interval.n == 3
    assert interval.half_width == pytest.approx(0.24843, abs=1e-5)
    assert interval.text() == "0.600 ± 0.248"
    single = mean_interval([0.42])
    assert single.n == 1 and math.isnan(single.half_width) and single.text() == "0.420"


def test_welch_interval_of_two_groups_with_unequal_variances():
    # a = 1,2,3: mean 2, s² = 1; b = 2,4,6,8: mean 5, s² = 20/3. se² = 1/3 + 5/3 = 2, se = 1.41421.
    # dof = 2² / ((1/3)²/2 + (5/3)²/3) = 4 / 0.98148 = 4.075, rounded down to 4: t = 2.776, half = 3.92586.
    interval = welch_difference([1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0])
    assert interval.method == WELCH and interval.n == 7
    assert interval.mean == pytest.approx(-3.0)
    assert interval.half_width == pytest.approx(2.776 * math.sqrt(2.0), abs=1e-6)
    assert (interval.low, interval.high) == pytest.approx((-6.92586, 0.92586), abs=1e-5)
    assert not interval.excludes_zero()


def test_paired_interval_takes_the_per_seed_differences():
    # differences 0.10, 0.15, 0.05: mean 0.1, s = 0.05, half = 4.303 * 0.05 / sqrt(3) = 0.12422
    a = {0: 0.50, 1: 0.60, 2: 0.70}
    b = {0: 0.40, 1: 0.45, 2: 0.65}
    interval = paired_difference(a, b)
    assert interval.method == PAIRED and interval.n == 3
    assert interval.mean == pytest.approx(0.1)
    assert interval.half_width == pytest.approx(0.12422, abs=1e-5)
    # The same numbers unpaired: the spread between seeds (0.1 and 0.13) swamps the 0.1 difference.
    assert welch_difference(list(a.values()), list(b.values())).half_width > 0.25


def test_difference_pairs_only_when_both_groups_ran_the_same_seeds():
    same = difference({0: 1.0, 1: 2.0}, {0: 0.5, 1: 1.0})
    assert same.method == PAIRED and same.mean == pytest.approx(0.75)
    other = difference({0: 1.0, 1: 2.0}, {0: 0.5, 2: 1.0})
    assert other.method == WELCH and other.mean == pytest.approx(0.75)
    one_seed = difference({0: 1.0}, {0: 0.5})
    assert one_seed.method == WELCH and math.isnan(one_seed.half_width) and one_seed.mean == pytest.approx(0.5)
