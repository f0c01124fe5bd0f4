"""What an evaluation of a code task records (pass@1 and the mean level reward, each with its 95% CI), against
answers worked out by hand, and the interval statistics under it."""

from __future__ import annotations

import math

import pytest

from comlrl_lab.data.code_eval import code_eval_metrics, counts_tests, passes_all
from comlrl_lab.data.confidence import mean_and_standard_error, t975, wilson_interval
from comlrl_lab.data.records import JointCandidate
from comlrl_lab.names import metric_names as M
from comlrl_lab.trainers.preference.rounds.collection import reward_summary
from comlrl_lab.ui import stats


def test_wilson_interval_known_values():
    # 1 of 4: p = 0.25, z^2 = 3.8415; centre (0.25 + 0.48019) / 1.96037 = 0.37248,
    # half 1.96 * sqrt(0.046875 + 0.060023) / 1.96037 = 0.32689 -> (0.0456, 0.6994), the textbook values.
    assert wilson_interval(1, 4) == pytest.approx((0.0456, 0.6994), abs=1e-4)
    # 0 of 32 keeps a width (Wald's would be (0, 0)): the upper end is z^2 / (n + z^2) = 3.8415 / 35.8415.
    assert wilson_interval(0, 32) == pytest.approx((0.0, 3.841459 / 35.841459), abs=1e-6)
    assert wilson_interval(32, 32) == pytest.approx((1 - 3.841459 / 35.841459, 1.0), abs=1e-6)
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


def test_mean_and_standard_error_plain_and_stratified():
    # 1, 2, 3: mean 2, s = 1, SE = 1 / sqrt(3).
    assert mean_and_standard_error([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1 / math.sqrt(3)))
    # Items a: 1, 3 (s^2 = 2) and b: 2, 2 (s^2 = 0), N = 4: SE^2 = (2 * 2 + 2 * 0) / 16 = 0.25.
    assert mean_and_standard_error([1.0, 3.0, 2.0, 2.0], ["a", "a", "b", "b"]) == pytest.approx((2.0, 0.5))
    # A lone sample of item c takes the pooled within-item variance, 2 / 2 = 1: SE^2 = (4 + 0 + 1) / 25.
    assert mean_and_standard_error([1.0, 3.0, 2.0, 2.0, 7.0], list("aabbc")) == pytest.approx((3.0, math.sqrt(5) / 5))
    assert math.isnan(mean_and_standard_error([1.0, 2.0], ["a", "b"])[1])  # no item has two samples
    assert math.isnan(mean_and_standard_error([4.0])[1]) and math.isnan(mean_and_standard_error([])[0])


def _eval(item: int, details: dict | None) -> JointCandidate:
    reward = details["reward"] - 4 if details else math.nan
    return JointCandidate(
        item, 0, "eval", ["p", "q"], ["a", "b"], [[1], [2]], [[0], [0]], reward=reward, details=details
    )


def _levels(passed: int, total: int, reward: float) -> dict:
    return {"tests_passed": passed, "tests_total": total, "reward": reward, "summary": "..."}


#: Four programs: all 7 tests (4.0), 3 of 7 (1.5 + 3/7), a problem without tests (1.5), nothing defined (0.4).
FOUR = [_levels(7, 7, 4.0), _levels(3, 7, 1.5 + 3 / 7), _levels(0, 0, 1.5), _levels(0, 7, 0.4)]


def test_pass_at_1_and_level_reward_with_their_intervals():
    candidates = [_eval(k, d) for k, d in enumerate(FOUR)] + [_eval(9, None)]  # an unscored one is left out
    metrics = code_eval_metrics(candidates)
    assert metrics[M.EVAL_PASS_AT_1] == 0.25  # only the first passes every test; no tests is not a pass
    assert (metrics[M.EVAL_PASS_AT_1_LOW], metrics[M.EVAL_PASS_AT_1_HIGH]) == pytest.approx((0.0456, 0.6994), abs=1e-4)
    levels = [4.0, 1.5 + 3 / 7, 1.5, 0.4]
    mean = sum(levels) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in levels) / 3)
    assert metrics[M.EVAL_LEVEL_REWARD_MEAN] == pytest.approx(mean)  # 1.83214: the raw levels, not reward - 4
    half = 3.182 * sd / 2  # t(0.975, 3) = 3.182, SE = s / sqrt(4)
    assert metrics[M.EVAL_LEVEL_REWARD_LOW] == pytest.approx(mean - half)
    assert metrics[M.EVAL_LEVEL_REWARD_HIGH] == pytest.approx(mean + half)
    assert len(metrics) == 6 and all(M.lookup(name).name == name for name in metrics)  # each named, with help


def test_with_several_samples_per_item_the_level_reward_error_is_the_trainers_stratified_one():
    candidates = [_eval(0, FOUR[0]), _eval(0, FOUR[1]), _eval(1, FOUR[2]), _eval(1, FOUR[3]), _eval(2, FOUR[0])]
    metrics = code_eval_metrics(candidates, stratified=True)
    mean, sem, n = reward_summary(candidates, stratified=True)  # on reward = level - 4: the same error
    assert n == 5 and metrics[M.EVAL_LEVEL_REWARD_MEAN] == pytest.approx(mean + 4)
    assert metrics[M.EVAL_LEVEL_REWARD_HIGH] - metrics[M.EVAL_LEVEL_REWARD_MEAN] == pytest.approx(t975(4) * sem)
    assert metrics[M.EVAL_PASS_AT_1] == pytest.approx(2 / 5)


def test_a_task_whose_reward_counts_no_tests_records_nothing():
    assert code_eval_metrics([_eval(0, None)]) == {}
    plain = JointCandidate(0, 0, "eval", ["p"], ["a"], [[1]], [[0]], reward=1.0, details={"reward": 1.0})
    assert code_eval_metrics([plain]) == {} and not counts_tests(plain.details)
    assert passes_all(FOUR[0]) and not passes_all(FOUR[2])


def test_the_workbench_reads_the_same_t_table():
    assert stats.t975 is t975 and stats.t975(3) == 3.182
