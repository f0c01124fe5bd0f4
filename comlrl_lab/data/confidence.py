"""95% confidence intervals from a sample: Student's t for a mean, Wilson's score interval for a proportion.

Only numbers; no pandas, no torch, no Streamlit. The trainers use it for what an evaluation records
(``code_eval``), the workbench (``ui.stats``, ``ui.intervals``) for its curves over seeds; the learning benchmark and
the notebooks for the same intervals. Callers compute means and sample standard deviations themselves.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

#: Two-sided 97.5% quantiles of Student's t for 1..30 degrees of freedom (the normal 1.96 beyond).
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t975(dof: int) -> float:
    """t_{0.975, dof}: the half-width of a 95% interval is ``t975(n - 1) * s / sqrt(n)``; NaN for dof < 1."""
    if dof < 1:
        return math.nan
    return _T975[dof - 1] if dof <= len(_T975) else 1.96


def ci95_half_width(std: float, n: int) -> float:
    """Half-width of the 95% confidence interval of a mean of ``n`` values with sample std ``std``."""
    if n < 2 or math.isnan(std):
        return math.nan
    return t975(n - 1) * std / math.sqrt(n)


#: The normal quantile of a two-sided 95% interval.
Z975 = 1.959964


def wilson_interval(successes: int, n: int) -> tuple[float, float]:
    """Wilson's 95% score interval of a proportion ``successes / n``; (NaN, NaN) for n = 0.

    Unlike the normal (Wald) interval it stays inside [0, 1] and does not shrink to a point at 0 or n successes:
    0 of 32 gives (0, 0.107), where Wald gives (0, 0).
    """
    if n <= 0:
        return math.nan, math.nan
    p, z2 = successes / n, Z975**2
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z975 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_and_standard_error(values: Sequence[float], strata: Sequence[Hashable] | None = None) -> tuple[float, float]:
    """(mean, standard error of the mean) of ``values``; NaN where there are too few values.

    Without ``strata`` the values are independent draws: SE = s / sqrt(n). With ``strata`` (one key per value: the
    eval item of each sample) the strata are held fixed and only the sampling within them counts: with m_i values
    of stratum i, of sample variance s_i^2, and N = sum m_i, SE^2 = sum m_i s_i^2 / N^2; a stratum of one value
    gets the pooled within-stratum variance. This is the trainers' evaluation error (``reward_summary``).
    """
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = math.fsum(values) / n
    if n < 2:
        return mean, math.nan
    if strata is None:
        return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1) / n)
    groups: dict[Hashable, list[float]] = {}
    for key, value in zip(strata, values, strict=True):
        groups.setdefault(key, []).append(value)
    total, squares, degrees, singles = 0.0, 0.0, 0, 0
    for members in groups.values():
        m = len(members)
        if m == 1:
            singles += 1
            continue
        centre = math.fsum(members) / m
        spread = math.fsum((v - centre) ** 2 for v in members)
        total += m * spread / (m - 1)
        squares += spread
        degrees += m - 1
    if degrees == 0:
        return mean, math.nan
    total += singles * squares / degrees
    return mean, math.sqrt(total) / n
