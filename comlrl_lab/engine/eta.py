"""How long work still takes: a phase, the phases queued after it, a sweep; from counts and earlier durations.

Pure functions of numbers the engine already has (seconds elapsed, steps done of a total, how long the same
phase took before), so the workbench, the CLI and tests compute the same estimate. An estimate is None when
nothing supports one, and never 0 while work remains: a phase that outlives its estimate is estimated again
from its own rate, or reported as unknown. This module measures nothing and keeps no state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from comlrl_lab.names.phases import PHASES

#: Earlier runs of a phase that an estimate averages (the latest ones: later rounds resemble recent ones).
HISTORY = 3
#: Below this many seconds an estimate says nothing a user can act on; the phase is reported as finishing.
FINISHING_S = 1.0


def text(seconds: float | None) -> str:
    """``"1m 05s"``, ``"42s"``; an en dash for an unknown estimate."""
    if seconds is None:
        return "–"
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 60}m {seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


def mean_recent(past: Sequence[float] | None) -> float | None:
    """Mean of the last ``HISTORY`` durations, or None without any."""
    recent = list(past or ())[-HISTORY:]
    return sum(recent) / len(recent) if recent else None


def phase_eta(elapsed: float, done: int, total: int, past: Sequence[float] | None = None) -> float | None:
    """Seconds left of a phase ``elapsed`` seconds in, with ``done`` of ``total`` steps counted.

    Two estimates: the same phase's recent durations minus ``elapsed`` (its steps are not equally long: train
    fits a reward model, then learns the policy), and the phase's own rate, ``elapsed * (total - done) / done``.
    The larger wins, so a phase running slower than before is not promised an early end. None when neither is
    known or both say under ``FINISHING_S``.
    """
    guesses = []
    typical = mean_recent(past)
    if typical is not None:
        guesses.append(typical - elapsed)
    if 0 < done < total:
        guesses.append(elapsed * (total - done) / done)
    best = max(guesses, default=None)
    return best if best is not None and best >= FINISHING_S else None


def queued_phases(phase: str, count: int, phases: tuple[str, ...] = PHASES) -> list[str]:
    """The ``count`` phases from ``phase`` on, in order (the current one first), rounds of ``phases``."""
    start = phases.index(phase)
    return [phases[(start + i) % len(phases)] for i in range(max(0, count))]


def queue_eta(current_left: float | None, later: Sequence[str], history: Mapping[str, Sequence[float]]) -> float | None:
    """Seconds until the queue is done: what the current phase has left plus each later phase's recent mean.

    None while a later phase has never run (the first round has nothing to go on), or the current one has no
    estimate.
    """
    if current_left is None:
        return None
    total = current_left
    for phase in later:
        typical = mean_recent(history.get(phase))
        if typical is None:
            return None
        total += typical
    return total


def sweep_eta(
    finished_seconds: Sequence[float], running_elapsed: Sequence[float], pending: int, parallel: int
) -> float | None:
    """Seconds until a sweep is done, once a cell has finished: cells take about the mean of the finished ones.

    ``running_elapsed`` holds how long each running cell has run; ``pending`` cells have not started. Cells run
    ``parallel`` at a time, so the work left is spread over that many slots.
    """
    if not finished_seconds:
        return None
    typical = sum(finished_seconds) / len(finished_seconds)
    left = sum(max(typical - elapsed, 0.0) for elapsed in running_elapsed) + pending * typical
    slots = max(1, min(parallel, len(running_elapsed) + pending))
    return left / slots
