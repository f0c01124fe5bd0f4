"""The public training API under CoMLRL's names: four configs, four trainers and the comparator adapter types.

A CoMLRL 1.4.3 script runs with its import line changed from ``comlrl.trainers.preference`` to
``comlrl_lab.trainers.preference``.
"""
# Differs from CoMLRL: only these public names are kept; its trainers' private methods and checkpoint helpers are not.

from __future__ import annotations

from comlrl_lab.lazy_imports import lazy_names
from comlrl_lab.trainers.preference.config import MADPOConfig, MADPOIterConfig, MARLHFConfig, MARLHFIterConfig

# The trainers import torch (about 2 s); the configs do not. Resolving them on first use keeps the Setup page
# and the CLI's config checks off torch's import path.
_LAZY = {
    "CentralizedComparatorAdapter": "comparators.centralized",
    "CentralizedComparatorParseError": "comparators.centralized",
    "TaggedCentralizedComparatorAdapter": "comparators.centralized",
    "MADPOIterTrainer": "madpo",
    "MADPOTrainer": "madpo",
    "MARLHFIterTrainer": "marlhf",
    "MARLHFTrainer": "marlhf",
    "JointRewardModel": "reward_model",
}


__getattr__ = lazy_names(__name__, _LAZY)


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
