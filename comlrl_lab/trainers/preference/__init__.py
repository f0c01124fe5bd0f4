"""The public training API under CoMLRL's names: four configs, four trainers and the comparator adapter types.

A CoMLRL 1.4.3 script runs with its import line changed from ``comlrl.trainers.preference`` to
``comlrl_lab.trainers.preference``.
"""

from __future__ import annotations

from comlrl_lab.trainers.preference.comparators.centralized import (
    CentralizedComparatorAdapter,
    CentralizedComparatorParseError,
    TaggedCentralizedComparatorAdapter,
)
from comlrl_lab.trainers.preference.config import MADPOConfig, MADPOIterConfig, MARLHFConfig, MARLHFIterConfig
from comlrl_lab.trainers.preference.madpo import MADPOIterTrainer, MADPOTrainer
from comlrl_lab.trainers.preference.marlhf import MARLHFIterTrainer, MARLHFTrainer
from comlrl_lab.trainers.preference.reward_model import JointRewardModel

__all__ = [
    "CentralizedComparatorAdapter",
    "CentralizedComparatorParseError",
    "JointRewardModel",
    "MADPOConfig",
    "MADPOIterConfig",
    "MADPOIterTrainer",
    "MADPOTrainer",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "MARLHFIterTrainer",
    "MARLHFTrainer",
    "TaggedCentralizedComparatorAdapter",
]
