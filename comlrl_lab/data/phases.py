"""The phases of one round, in order: the names trainers report, the store records and the pages show.

They live here, in the lowest layer both the trainers and the store may import, so neither keeps a copy.
"""

from __future__ import annotations

PHASES: tuple[str, ...] = ("collect", "select", "train", "evaluate")
