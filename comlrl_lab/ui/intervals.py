"""95% confidence intervals over runs: of a group's mean, and of the difference between two groups.

A group's runs differ only in their seed, so each run is one sample. Two groups are compared either **paired by
seed** (when both ran the same seeds: with one seed, two runs draw their evaluation samples from the same per-row
seeds, common random numbers, so the per-seed difference cancels the noise they share) or with **Welch's** t
interval for unequal variances (otherwise). Welch's degrees of freedom (Welch-Satterthwaite) are rounded down to
use the t table of ``stats``, which makes the interval slightly wider than the exact one, never narrower.
Only numbers; no pandas, no torch.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from comlrl_lab.ui.stats import t975

PAIRED = "paired by seed"
WELCH = "Welch"


@dataclass(frozen=True)
class Interval:
    """An estimate (a mean, or a difference of means) with the half-width of its 95% CI and its sample count."""

    mean: float
    half_width: float  # NaN when there are too few samples for an interval
    n: int
    method: str = "mean"

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def excludes_zero(self) -> bool:
        return not math.isnan(self.half_width) and (self.low > 0 or self.high < 0)

    def text(self, digits: int = 3, *, signed: bool = False) -> str:
        """``"0.512 ± 0.034"`` (``"+0.512 ± 0.034"`` when ``signed``), or the value alone without an interval."""
        value = f"{self.mean:{'+' if signed else ''}.{digits}f}"
        return value if math.isnan(self.half_width) else f"{value} ± {self.half_width:.{digits}f}"

    def __str__(self) -> str:
        return self.text(signed=True)


def mean_interval(values: Sequence[float]) -> Interval:
    """The mean of ``values`` with its Student t 95% CI (NaN half-width for fewer than two values)."""
    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, 0)
    mean = statistics.fmean(values)
    if n < 2:
        return Interval(mean, math.nan, 1)
    return Interval(mean, t975(n - 1) * statistics.stdev(values) / math.sqrt(n), n)


def welch_difference(a: Sequence[float], b: Sequence[float]) -> Interval:
    """mean(a) - mean(b) with Welch's 95% CI; ``n`` is the number of runs in both groups."""
    n_a, n_b = len(a), len(b)
    if n_a < 2 or n_b < 2:
        value = statistics.fmean(a) - statistics.fmean(b) if n_a and n_b else math.nan
        return Interval(value, math.nan, n_a + n_b, WELCH)
    va, vb = statistics.variance(a) / n_a, statistics.variance(b) / n_b
    se = math.sqrt(va + vb)
    if se == 0.0:
        dof = n_a + n_b - 2
    else:
        dof = (va + vb) ** 2 / (va**2 / (n_a - 1) + vb**2 / (n_b - 1))
    half = t975(max(1, math.floor(dof))) * se
    return Interval(statistics.fmean(a) - statistics.fmean(b), half, n_a + n_b, WELCH)


def paired_difference(a: Mapping[int, float], b: Mapping[int, float]) -> Interval:
    """Mean over the seeds both groups ran of a[seed] - b[seed], with its t 95% CI; ``n`` is that seed count."""
    seeds = sorted(set(a) & set(b))
    diffs = [a[s] - b[s] for s in seeds]
    interval = mean_interval(diffs)
    return Interval(interval.mean, interval.half_width, interval.n, PAIRED)


def difference(a: Mapping[int, float], b: Mapping[int, float]) -> Interval:
    """a - b by seed: paired when both groups ran the same two or more seeds, Welch's interval otherwise."""
    if set(a) == set(b) and len(a) >= 2:
        return paired_difference(a, b)
    return welch_difference(list(a.values()), list(b.values()))
