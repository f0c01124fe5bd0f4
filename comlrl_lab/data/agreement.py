"""Agreement between labellers: Cohen's kappa and percent agreement for two, Fleiss' kappa and Krippendorff's alpha
for several.

Pure arithmetic over category labels (any hashable values); no torch, no store. ``nan`` where a statistic is
undefined (no items, or chance agreement already perfect), never a made-up number. The tests check each one on a
published worked example (see ``tests/test_labels.py``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence


def percent_agreement(first: Sequence[Hashable], second: Sequence[Hashable]) -> float:
    """Share of items (0..1) on which two raters gave the same category; nan without items."""
    _check_paired(first, second)
    if not first:
        return math.nan
    return sum(a == b for a, b in zip(first, second)) / len(first)


def cohen_kappa(first: Sequence[Hashable], second: Sequence[Hashable]) -> float:
    """Cohen's kappa of two raters over the same items: (p_o - p_e) / (1 - p_e), with p_e from each rater's own
    category shares; nan without items or when p_e is 1 (both raters always used one and the same category)."""
    _check_paired(first, second)
    n = len(first)
    if n == 0:
        return math.nan
    observed = percent_agreement(first, second)
    shares_a, shares_b = Counter(first), Counter(second)
    expected = math.fsum(shares_a[c] * shares_b[c] for c in shares_a) / (n * n)
    if expected >= 1.0:
        return math.nan
    return (observed - expected) / (1.0 - expected)


def fleiss_kappa(counts: Sequence[Sequence[int]]) -> float:
    """Fleiss' kappa of a subjects x categories table of rating counts, every subject rated by the same number
    (at least 2) of raters; nan for an empty table or when chance agreement is perfect."""
    rows = [list(map(int, row)) for row in counts]
    if not rows:
        return math.nan
    raters = sum(rows[0])
    if raters < 2 or any(sum(row) != raters for row in rows):
        raise ValueError("Fleiss' kappa needs the same number (>= 2) of ratings for every subject")
    subjects = len(rows)
    per_subject = [(sum(c * c for c in row) - raters) / (raters * (raters - 1)) for row in rows]
    observed = math.fsum(per_subject) / subjects
    shares = [sum(row[j] for row in rows) / (subjects * raters) for j in range(len(rows[0]))]
    expected = math.fsum(p * p for p in shares)
    if expected >= 1.0:
        return math.nan
    return (observed - expected) / (1.0 - expected)


def krippendorff_alpha_nominal(units: Sequence[Sequence[Hashable]]) -> float:
    """Krippendorff's alpha for nominal data. ``units`` holds, per unit, the values its raters gave (missing ones
    left out); units with fewer than two values are not pairable and count for nothing. nan when fewer than two
    pairable values exist or every pairable value is the same category."""
    coincidences: Counter[tuple[Hashable, Hashable]] = Counter()
    for values in units:
        m = len(values)
        if m < 2:
            continue
        for i, c in enumerate(values):
            for j, k in enumerate(values):
                if i != j:
                    coincidences[(c, k)] += 1.0 / (m - 1)
    totals: Counter[Hashable] = Counter()
    for (c, _), weight in coincidences.items():
        totals[c] += weight
    n = math.fsum(totals.values())
    if n < 2:
        return math.nan
    disagreement = math.fsum(w for (c, k), w in coincidences.items() if c != k)
    chance = math.fsum(totals[c] * totals[k] for c in totals for k in totals if c != k)
    if chance == 0:
        return math.nan
    return 1.0 - (n - 1.0) * disagreement / chance


def _check_paired(first: Sequence[Hashable], second: Sequence[Hashable]) -> None:
    if len(first) != len(second):
        raise ValueError(f"two raters must rate the same items: {len(first)} against {len(second)} ratings")
