"""Where trainers send what they produce: records per finished phase and live progress.

Trainers never see DuckDB. The engine hands in a ``RecordSink`` that writes to the store; the plain Python API
uses ``NullSink`` and keeps nothing but the replay files, as CoMLRL does. Progress and cancellation go through
``PhaseControl`` so long loops can report counts and stop cooperatively.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from comlrl_lab.data.labels import Label
from comlrl_lab.data.records import JointCandidate, PreferencePair
from comlrl_lab.names.phases import PHASES

__all__ = ["PHASES", "MemorySink", "NullSink", "PhaseCancelled", "PhaseControl", "PhaseRecords", "RecordSink"]


@dataclass
class PhaseRecords:
    """Everything one finished phase produced, committed together."""

    round_index: int
    phase: str
    candidates: list[JointCandidate] = field(default_factory=list)
    pairs: list[PreferencePair] = field(default_factory=list)
    replay_rows: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)  # {"step", "name", "value"}
    events: list[dict[str, Any]] = field(default_factory=list)  # {"level", "message"}
    # log_reward_distribution: one row per (series, side), as data.reward_distribution.distribution_rows makes them
    reward_distributions: list[dict[str, Any]] = field(default_factory=list)
    # the label phase of a judge run: the judge's kept verdicts (people's are written as they give them)
    labels: list[Label] = field(default_factory=list)

    def add_metrics(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.metrics.append({"step": int(step), "name": name, "value": float(value)})

    def add_event(self, level: str, message: str) -> None:
        self.events.append({"level": level, "message": message})


class RecordSink(Protocol):
    def commit_phase(self, records: PhaseRecords) -> None: ...

    def add_phase_metrics(self, round_index: int, phase: str, step: int, values: dict[str, float]) -> None:
        """Metrics of a committed phase known only after its commit (its checkpoint's cost); may be called from
        the checkpoint writer's thread. A later commit of the same phase replaces them."""
        ...

    def labels(self, round_index: int) -> list[Label]:
        """Every verdict given so far on round ``round_index``'s comparisons (people's, and a judge's committed)."""
        ...


class NullSink:
    """Keeps nothing; the Python API default."""

    def commit_phase(self, records: PhaseRecords) -> None:
        return None

    def add_phase_metrics(self, round_index: int, phase: str, step: int, values: dict[str, float]) -> None:
        return None

    def labels(self, round_index: int) -> list[Label]:
        return []


class MemorySink:
    """Keeps every phase's records in memory (tests, notebooks); ``give`` adds people's verdicts."""

    def __init__(self) -> None:
        self.phases: list[PhaseRecords] = []
        self.given: list[Label] = []

    def give(self, *labels: Label) -> None:
        """People's verdicts, as the labelling view writes them to the store."""
        self.given.extend(labels)

    def labels(self, round_index: int) -> list[Label]:
        committed = [label for r in self.phases for label in r.labels]
        return [label for label in (*self.given, *committed) if label.round == round_index]

    def commit_phase(self, records: PhaseRecords) -> None:
        self.phases.append(records)

    def add_phase_metrics(self, round_index: int, phase: str, step: int, values: dict[str, float]) -> None:
        committed = [r for r in self.phases if (r.round_index, r.phase) == (round_index, phase)]
        committed[-1].add_metrics(step, values)

    def pairs(self, round_index: int | None = None) -> list[PreferencePair]:
        return [p for r in self.phases if round_index in (None, r.round_index) for p in r.pairs]

    def metric(self, name: str) -> list[tuple[int, float]]:
        return [(m["step"], m["value"]) for r in self.phases for m in r.metrics if m["name"] == name]


class PhaseCancelled(Exception):
    """Raised inside a long loop when the controller asked to stop; the phase is not committed."""


class PhaseControl:
    """Progress reporting and cooperative cancellation for one phase at a time.

    The engine subclasses or wraps this; the Python API uses it as is (never cancels, prints nothing).
    """

    def __init__(self) -> None:
        self.phase: str | None = None
        self.round_index: int = 0
        self.done = 0
        self.total = 0
        self.tokens = 0
        self.started_at = time.monotonic()

    def begin(self, round_index: int, phase: str, total: int) -> None:
        self.round_index, self.phase, self.total, self.done, self.tokens = round_index, phase, int(total), 0, 0
        self.started_at = time.monotonic()

    def advance(self, count: int = 1, tokens: int = 0) -> None:
        self.done += int(count)
        self.tokens += int(tokens)
        self.check_cancel()

    def check_cancel(self) -> None:
        if self.cancel_requested():
            raise PhaseCancelled(f"{self.phase} of round {self.round_index} was cancelled")

    def cancel_requested(self) -> bool:
        return False
