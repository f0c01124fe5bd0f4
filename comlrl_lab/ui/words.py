"""Counts in words for the pages: "1 run", "2 runs", and the verb that agrees with them. No Streamlit."""

from __future__ import annotations


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 (``plural`` when adding "s" is wrong): "1 run", "3 runs"."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def agrees(n: int, singular: str, plural: str) -> str:
    """The verb for a count of ``n``: "1 run matches", "2 runs match"."""
    return singular if n == 1 else plural
