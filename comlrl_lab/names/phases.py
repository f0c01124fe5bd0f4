"""The phases of one round, in order: the names trainers report, the store records and the pages show.

A run labelled by people or a judge model (``preference_source`` human or judge) has a ``label`` phase between
collect and select; a run whose oracle is the reward function has the four phases it always had.

They live in ``comlrl_lab.names``, the bottom layer, which both the trainers and the store may import, so neither
keeps a copy. So does the one check that a phase is asked for in order: the trainer's ``step`` makes it, and the engine makes it too
before a trainer is built, from the cursor a checkpoint gives.
"""

from __future__ import annotations

#: The phases of a round whose preferences come from the reward function (``preference_source="reward"``).
PHASES: tuple[str, ...] = ("collect", "select", "train", "evaluate")
#: People or a judge label the collected comparisons between collect and select.
LABEL_PHASE = "label"
#: Every phase name in round order: the phases of a labelled round, and the order the store and pages sort by.
ALL_PHASES: tuple[str, ...] = ("collect", LABEL_PHASE, "select", "train", "evaluate")


def round_phases(preference_source: str) -> tuple[str, ...]:
    """The phases of one round of a run whose preferences come from ``preference_source`` (reward, human, judge)."""
    return PHASES if preference_source == "reward" else ALL_PHASES


class InvalidTransition(RuntimeError):
    """A phase was asked for out of order, or while another one runs."""


def check_next_phase(asked: str, round_index: int, next_phase: str | None) -> None:
    """Raise ``InvalidTransition`` unless ``asked`` is ``next_phase``, the next phase of round ``round_index``."""
    if asked != next_phase:
        raise InvalidTransition(f"cannot run '{asked}' now: the next phase of round {round_index} is '{next_phase}'")
