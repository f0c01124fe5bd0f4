"""Comparators: who writes the other side of every iterative comparison, resolved once from ``comparator_policy``.

Each comparator turns (items, per-agent prompts, M) into ``joint[k][j]`` candidates on the comparator side.
Local ones (``current``, ``current_copy``, ``model``, ``history``) sample with the comparator's own RNG stream so
the training stream never moves; ``api`` asks a remote endpoint. Centralized generation (one model writes
every role) is a mode of all of them.
"""

from __future__ import annotations

from comlrl_lab.trainers.preference.comparators.base import Comparator, ComparatorContext
from comlrl_lab.trainers.preference.comparators.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)
from comlrl_lab.trainers.preference.comparators.local import (
    CurrentComparator,
    CurrentCopyComparator,
    HistoryComparator,
    ModelComparator,
)
from comlrl_lab.trainers.preference.comparators.remote import RemoteApiComparator

#: comparator_policy (canonical, after the config's alias normalisation) -> class. The only place it is resolved.
COMPARATORS: dict[str, type[Comparator]] = {
    "current": CurrentComparator,
    "current_copy": CurrentCopyComparator,
    "model": ModelComparator,
    "history": HistoryComparator,
    "api": RemoteApiComparator,
}


def build_comparator(context: ComparatorContext) -> Comparator:
    return COMPARATORS[context.config.comparator_policy](context)


__all__ = [
    "COMPARATORS",
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "Comparator",
    "ComparatorContext",
    "TaggedCentralizedComparatorAdapter",
    "build_comparator",
]
