"""The table of preference algorithms: each name's family, whether it runs rounds, and its config and trainer.

Everything that needs to know what "MARLHFIter" means (the engine, the Setup form, run views) asks this
table instead of parsing the name. It imports no torch: the trainer is named, and the engine resolves it.
"""

from __future__ import annotations

from dataclasses import dataclass

from comlrl_lab.trainers.preference.config import (
    ConfigError,
    MADPOConfig,
    MADPOIterConfig,
    MARLHFConfig,
    MARLHFIterConfig,
)

__all__ = ["ALGORITHM_TABLE", "FAMILIES", "Algorithm", "algorithm", "algorithm_name"]


@dataclass(frozen=True)
class Algorithm:
    """One row: ``name`` is CoMLRL's ``algorithm_name``; ``family`` the non-iterative algorithm it repeats."""

    name: str
    family: str
    iterative: bool
    config_class: type[MADPOConfig]
    trainer_class_name: str


ALGORITHM_TABLE: dict[str, Algorithm] = {
    row.name: row
    for row in (
        Algorithm("MADPO", "MADPO", False, MADPOConfig, "MADPOTrainer"),
        Algorithm("MADPOIter", "MADPO", True, MADPOIterConfig, "MADPOIterTrainer"),
        Algorithm("MARLHF", "MARLHF", False, MARLHFConfig, "MARLHFTrainer"),
        Algorithm("MARLHFIter", "MARLHF", True, MARLHFIterConfig, "MARLHFIterTrainer"),
    )
}
FAMILIES: tuple[str, ...] = tuple(dict.fromkeys(row.family for row in ALGORITHM_TABLE.values()))


def algorithm(name: str) -> Algorithm:
    """The row of ``name``; a ``ConfigError`` about the spec's ``algorithm`` listing the known names otherwise."""
    if name not in ALGORITHM_TABLE:
        raise ConfigError(
            f"algorithm must be one of: {', '.join(ALGORITHM_TABLE)}; got {name!r}", field="algorithm", value=name
        )
    return ALGORITHM_TABLE[name]


def algorithm_name(family: str, iterative: bool) -> str:
    """The algorithm of ``family`` that runs rounds (``iterative``) or not."""
    for row in ALGORITHM_TABLE.values():
        if row.family == family and row.iterative == bool(iterative):
            return row.name
    raise ValueError(f"family must be one of: {', '.join(FAMILIES)}; got {family!r}")
