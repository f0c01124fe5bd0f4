"""What the CLI writes about a run's progress: the live bar's text on a terminal (``bar_text``), and one line per
finished phase when stderr is a file or a pipe (``PhaseLines``).

A tqdm bar written to a file became thousands of carriage-return updates, with a stale description between
phases; ``PhaseLines`` writes ``loading models: 0.5 s``, ``round 1/2 collect: 3.1 s``, ... from the run's phase
timings (``Progress.history``), so each phase gets its line however the polling falls. Nothing here draws a bar.
"""

from __future__ import annotations

from typing import Any


def bar_text(progress: Any) -> tuple[str, str, str | None]:
    """(description, unit, ETA of all the queued work) of the progress bar for one ``Progress``."""
    # Imported here, as below: the engine brings pandas and duckdb, and `comlrl-lab --help` does without them.
    from comlrl_lab.engine.manager import PHASE_UNITS

    rounds = f"/{progress.num_rounds}" if progress.num_rounds else ""
    phase = progress.phase or progress.next_phase
    if progress.status == "loading":
        return "loading models", "step", eta_text(progress.queue_eta())
    if phase is None:
        return f"done: {progress.shown_round}{rounds} rounds", "step", None
    description = f"round {progress.shown_round}{rounds} {phase}"
    return description, PHASE_UNITS.get(phase, "step"), eta_text(progress.queue_eta())


def eta_text(seconds: float | None) -> str | None:
    """``seconds`` as the CLI writes a time left, or None."""
    from comlrl_lab.engine import eta

    return None if seconds is None else eta.text(seconds)


class PhaseLines:
    """Progress when stderr is not a terminal (a log file, a pipe): one line per phase as it ends, from the run's
    phase timings (``Progress.history``), such as ``round 1/2 collect: 3.1 s``. A tqdm bar there became thousands of
    carriage-return updates, with a stale description between phases. A phase's k-th timing is its round k (the
    history holds the run's earlier rounds too, so a resumed run counts on)."""

    def __init__(self, file: Any, before: Any, *, disable: bool = False) -> None:
        """``before``: the run's ``Progress`` before this process starts it; the phases it has timed are not written."""
        self.file, self.disable = file, disable
        self.seen = {phase: len(seconds) for phase, seconds in before.history.items()}

    def update(self, progress: Any) -> None:
        from comlrl_lab.engine.manager import LOAD

        rounds = f"/{progress.num_rounds}" if progress.num_rounds else ""
        for phase, seconds in progress.history.items():
            for k in range(self.seen.get(phase, 0), len(seconds)):
                what = "loading models" if phase == LOAD else f"round {k + 1}{rounds} {phase}"
                self._write(f"{what}: {seconds[k]:.1f} s")
            self.seen[phase] = len(seconds)

    def _write(self, line: str) -> None:
        if not self.disable:
            print(line, file=self.file, flush=True)
