"""CoMLRL's per-round reward distributions: histograms of raw rewards over ``reward_func.reward_range``.

One round's distribution has two series, each split by side: ``candidate`` (every finite raw reward the current
agents and the comparator sampled that round) and ``selected`` (the current and comparator raw rewards of the
round's training pairs). ``distribution_payload`` builds CoMLRL's ``reward_distributions/iteration_NNNN.json``
document, ``write_distribution_file`` writes it as CoMLRL does (indent 2, temporary file then rename), and
``distribution_rows`` flattens it into one row per (series, side) for the store. This module computes and writes
files; it does not sample, score or touch the store.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: CoMLRL's bin count: 16 bins, so 17 edges spread evenly over the reward range.
NUM_BINS = 16
#: Series and sides in CoMLRL's file order. The file says "target" for the current agents' side.
SERIES = ("candidate", "selected")
FILE_SIDES = ("target", "comparator")
#: The store's name for each file side (the store calls the current agents' side "current" everywhere).
STORE_SIDES = {"target": "current", "comparator": "comparator"}
DISTRIBUTION_DIR = "reward_distributions"

MISSING_RANGE_MESSAGE = (
    "log_reward_distribution=True requires reward_func.reward_range = (min, max), a finite pair with min < max; "
    "declare it with set_reward_range(reward_func, min, max)."
)


def declared_reward_range(reward_func: Callable[..., Any] | None) -> tuple[float, float] | None:
    """``reward_func.reward_range`` as floats, or None when it is missing or not a finite pair with min < max."""
    declared = getattr(reward_func, "reward_range", None)
    try:
        low, high = (float(v) for v in declared)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        return None
    return low, high


def distribution_file_name(iteration: int) -> str:
    return f"iteration_{int(iteration):04d}.json"


def _series(values: Sequence[float], edges: np.ndarray, low: float, high: float) -> dict[str, Any]:
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    # Values outside the declared range count in the edge bins rather than vanishing (CoMLRL clips them).
    counts, _ = np.histogram(np.clip(np.asarray(finite, dtype=float), low, high), bins=edges)
    return {
        "sample_count": len(finite),
        "mean": float(np.mean(finite)) if finite else None,
        "counts": [int(c) for c in counts],
        "raw_rewards": finite,
    }


def distribution_payload(
    iteration: int,
    reward_range: tuple[float, float],
    candidate: Mapping[str, Sequence[float]],
    selected: Mapping[str, Sequence[float]],
) -> dict[str, Any] | None:
    """CoMLRL's reward-distribution document for one round, or None when every series is empty (no file then).

    ``candidate`` and ``selected`` map "target" and "comparator" to raw rewards; non-finite values are dropped.
    """
    low, high = float(reward_range[0]), float(reward_range[1])
    edges = np.linspace(low, high, NUM_BINS + 1)
    by_series = {
        name: {side: _series(values.get(side, ()), edges, low, high) for side in FILE_SIDES}
        for name, values in (("candidate", candidate), ("selected", selected))
    }
    if not any(s["sample_count"] for sides in by_series.values() for s in sides.values()):
        return None
    return {
        "iteration": int(iteration),
        "reward_min": low,
        "reward_max": high,
        "num_bins": NUM_BINS,
        "bin_edges": [float(e) for e in edges],
        "bin_centers": [float(c) for c in (edges[:-1] + edges[1:]) / 2],
        **by_series,
    }


def write_distribution_file(directory: str | os.PathLike[str], payload: Mapping[str, Any]) -> Path:
    """Write ``payload`` as ``directory/iteration_NNNN.json`` (indent 2, via a temporary file and a rename)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / distribution_file_name(payload["iteration"])
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    os.replace(tmp, path)
    return path


def distribution_rows(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One store row per (series, side): the range, bin edges, counts, sample count, mean and the raw rewards."""
    return [
        {
            "series": name,
            "side": STORE_SIDES[side],
            "reward_min": float(payload["reward_min"]),
            "reward_max": float(payload["reward_max"]),
            "bin_edges": list(payload["bin_edges"]),
            "counts": list(payload[name][side]["counts"]),
            "sample_count": int(payload[name][side]["sample_count"]),
            "mean": payload[name][side]["mean"],
            "raw_rewards": list(payload[name][side]["raw_rewards"]),
        }
        for name in SERIES
        for side in FILE_SIDES
    ]


def payload_from_rows(iteration: int, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The file document rebuilt from one round's store rows (``distribution_rows`` read back), for exports."""
    by_key = {(r["series"], r["side"]): r for r in rows}
    first = rows[0]
    edges = [float(e) for e in first["bin_edges"]]
    payload: dict[str, Any] = {
        "iteration": int(iteration),
        "reward_min": float(first["reward_min"]),
        "reward_max": float(first["reward_max"]),
        "num_bins": len(edges) - 1,
        "bin_edges": edges,
        "bin_centers": [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])],
    }
    for name in SERIES:
        payload[name] = {}
        for side in FILE_SIDES:
            row = by_key.get((name, STORE_SIDES[side]))
            mean = None if row is None or row["mean"] is None else float(row["mean"])
            payload[name][side] = {
                "sample_count": 0 if row is None else int(row["sample_count"]),
                "mean": None if mean is not None and math.isnan(mean) else mean,
                "counts": [0] * (len(edges) - 1) if row is None else [int(c) for c in row["counts"]],
                "raw_rewards": [] if row is None else [float(v) for v in row["raw_rewards"]],
            }
    return payload
