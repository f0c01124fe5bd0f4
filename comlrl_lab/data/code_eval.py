"""What a coder reports of an evaluation on a code task: pass@1 and the mean level reward, each with its 95% CI.

It reads the breakdowns the task reward stored on the evaluation's candidates (``JointCandidate.details``, such as
humaneval's ``CodeLevels``: ``tests_passed``, ``tests_total``, ``reward``). A program passes when it has tests and
passes every one. pass@1's interval is Wilson's, the level reward's mean ± t_{0.975, n-1} SE with the trainers'
evaluation error (stratified by item when items have several samples). Candidates without such a breakdown are left
out; a task whose reward counts no tests reports nothing. It runs nothing and imports neither torch nor the store.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from comlrl_lab.data.confidence import mean_and_standard_error, t975, wilson_interval
from comlrl_lab.data.records import JointCandidate
from comlrl_lab.names import metric_names as M


def counts_tests(details: Mapping[str, Any] | None) -> bool:
    """Whether a breakdown says how many of its program's tests passed (and what it scored)."""
    return bool(details) and all(key in details for key in ("tests_passed", "tests_total", "reward"))


def passes_all(details: Mapping[str, Any]) -> bool:
    """The program has tests and passes every one of them."""
    return int(details["tests_total"]) > 0 and int(details["tests_passed"]) == int(details["tests_total"])


def code_eval_metrics(candidates: Sequence[JointCandidate], *, stratified: bool = False) -> dict[str, float]:
    """The ``eval/code/*`` metrics of the evaluation's scored candidates; {} when none has a test-counting breakdown.

    ``stratified``: the items have several samples each (``eval_samples_per_item`` > 1), so the level reward's error
    holds the items fixed, as ``eval/turn_1/reward_sem`` does.
    """
    scored = [c for c in candidates if counts_tests(c.details)]
    if not scored:
        return {}
    n = len(scored)
    passed = sum(passes_all(c.details) for c in scored)
    low, high = wilson_interval(passed, n)
    levels = [float(c.details["reward"]) for c in scored]
    mean, error = mean_and_standard_error(levels, [c.item_index for c in scored] if stratified else None)
    half = t975(n - 1) * error if not math.isnan(error) else math.nan
    return {
        M.EVAL_PASS_AT_1: passed / n,
        M.EVAL_PASS_AT_1_LOW: low,
        M.EVAL_PASS_AT_1_HIGH: high,
        M.EVAL_LEVEL_REWARD_MEAN: mean,
        M.EVAL_LEVEL_REWARD_LOW: mean - half,
        M.EVAL_LEVEL_REWARD_HIGH: mean + half,
    }
