"""Small-sample statistics for curves over seeds: Student's t quantile of a two-sided 95% interval.

Only numbers; no pandas, no torch, no Streamlit. Callers compute means and sample standard deviations themselves.
It lives with the workbench, whose Compare page and metric frames draw mean ± 95% CI curves over seeds; the
learning benchmark and the notebooks import it from here for the same intervals.
"""

from __future__ import annotations

import math

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
