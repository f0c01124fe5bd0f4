"""The phases of one round, in order: the names trainers report, the store records and the pages show.

They live in ``comlrl_lab.names``, the bottom layer, which both the trainers and the store may import, so neither
keeps a copy. So does the one check that a phase is asked for in order: the trainer's ``step`` makes it, and the engine makes it too
before a trainer is built, from the cursor a checkpoint gives.
"""

from __future__ import annotations

PHASES: tuple[str, ...] = ("collect", "select", "train", "evaluate")


class InvalidTransition(RuntimeError):
    """A phase was asked for out of order, or while another one runs."""


def check_next_phase(asked: str, round_index: int, next_phase: str | None) -> None:
    """Raise ``InvalidTransition`` unless ``asked`` is ``next_phase``, the next phase of round ``round_index``."""
    if asked != next_phase:
        raise InvalidTransition(f"cannot run '{asked}' now: the next phase of round {round_index} is '{next_phase}'")
