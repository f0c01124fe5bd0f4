"""Calling task reward functions with CoMLRL's convention, in batches where the function allows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def batched_reward(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a reward function as batch-capable: given k completions per agent it returns k joint rewards."""
    fn.supports_batch = True  # type: ignore[attr-defined]
    return fn


def set_reward_range(fn: Callable[..., Any], low: float, high: float) -> Callable[..., Any]:
    """Attach ``reward_range = (low, high)`` (CoMLRL's helper of the same name)."""
    low, high = float(low), float(high)
    if not (low < high):
        raise ValueError("reward_range must be a finite (min, max) pair with min < max.")
    fn.reward_range = (low, high)  # type: ignore[attr-defined]
    return fn
