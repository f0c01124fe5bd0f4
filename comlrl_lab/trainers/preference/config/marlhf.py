"""``MARLHFConfig``: MADPO's fields plus the reward model's and online multi-agent RL's."""

from __future__ import annotations

from dataclasses import dataclass, field

from comlrl_lab.trainers.preference.config.madpo import MADPOConfig
from comlrl_lab.trainers.preference.config.validation import (
    MAGRPO_FAMILY_ADVANTAGE_MODE,
    ConfigError,
    _choose,
    _is_int,
    _is_number,
    check_bound,
)


@dataclass(repr=False)
class MARLHFConfig(MADPOConfig):
    """Config of ``MARLHFTrainer``: a Bradley-Terry reward model, then online multi-agent RL against it."""

    rl_algorithm: str = field(
        default="magrpo",
        metadata={
            "help": "Policy-learning algorithm: magrpo (group-mean baseline), mareinforce (alias mareforce; raw reward), maremax (group max), marloo (leave-one-out), maac (central critic) or iac (independent critics).",
            "choices": ("magrpo", "mareinforce", "maremax", "marloo", "maac", "iac"),
            "aliases": {"mareforce": "mareinforce"},
            "group": "Policy learning (MARLHF)",
        },
    )
    num_generations: int = field(
        default=4,
        metadata={
            "minimum": 1,
            "help": "G: samples per prompt in online RL (>= 2 for the MAGRPO family, >= 1 for maac/iac).",
            "group": "Policy learning (MARLHF)",
        },
    )
    reward_model_name: str | None = field(
        default=None,
        metadata={
            "help": "Hugging Face id or path of the reward-model backbone; None uses the agents' model id (required when agents are model objects).",
            "group": "Reward model (MARLHF)",
        },
    )
    # Differs from CoMLRL: its default is "cuda:0", which fails on CPU-only hosts.
    reward_model_device: str | None = field(
        default=None,
        metadata={
            "help": "Device of the reward model; None follows the first agent device (CoMLRL defaults to 'cuda:0').",
            "group": "Reward model (MARLHF)",
        },
    )
    reward_learning_rate: float = field(
        default=1e-5,
        metadata={
            "exclusive_minimum": 0,
            "help": "AdamW learning rate of the reward model (> 0).",
            "group": "Reward model (MARLHF)",
        },
    )
    reward_num_train_epochs: int = field(
        default=1,
        metadata={
            "minimum": 1,
            "help": "Bradley-Terry training epochs over the pairs.",
            "group": "Reward model (MARLHF)",
        },
    )
    reward_train_batch_size: int = field(
        default=1,
        metadata={"minimum": 1, "help": "Pairs per Bradley-Terry optimiser step.", "group": "Reward model (MARLHF)"},
    )
    reward_max_length: int | None = field(
        default=None,
        metadata={
            "minimum": 1,
            "bound_allows_none": True,
            "bound_says_null": True,
            "help": "Token truncation length of reward-model inputs; None = the tokenizer's model maximum.",
            "group": "Reward model (MARLHF)",
        },
    )
    reward_freeze_backbone: bool = field(
        default=False, metadata={"help": "Train only the reward model's scalar head.", "group": "Reward model (MARLHF)"}
    )
    critic_model_name: str | None = field(
        default=None,
        metadata={
            "help": "Critic backbone for maac/iac; None uses the agents' model id (required when agents are model objects).",
            "group": "Policy learning (MARLHF)",
        },
    )
    critic_learning_rate: float | None = field(
        default=None,
        metadata={
            "exclusive_minimum": 0,
            "bound_allows_none": True,
            "help": "Critic learning rate (> 0); None = agent_learning_rate.",
            "group": "Policy learning (MARLHF)",
        },
    )
    critic_devices: str | list[str] | None = field(
        default=None,
        metadata={
            "help": "Critic devices for maac/iac; None = automatic (agent_devices with parallel_training='mp').",
            "group": "Policy learning (MARLHF)",
            "none_means": "automatic",
        },
    )
    use_separate_critic: bool = field(
        default=True,
        metadata={
            "help": "iac: separate critic models (True) or value heads on the actors (False).",
            "group": "Policy learning (MARLHF)",
        },
    )
    critic_type: str = field(
        default="v",
        metadata={
            "help": "'v' = V(prompt) or 'q' = Q(prompt + response).",
            "choices": ("v", "q"),
            "group": "Policy learning (MARLHF)",
        },
    )
    value_loss_coef: float = field(
        default=0.6,
        metadata={
            "exclusive_minimum": 0,
            "help": "Weight of the critic loss (> 0).",
            "group": "Policy learning (MARLHF)",
        },
    )
    value_clip_range: float | None = field(
        default=0.2,
        metadata={
            "exclusive_minimum": 0,
            "bound_allows_none": True,
            "help": "iac value clipping range (> 0), used without a separate critic; None disables.",
            "group": "Policy learning (MARLHF)",
        },
    )
    critic_value_head_hidden_dim: int | None = field(
        default=None,
        metadata={
            "help": "Hidden width of the iac critic's value head; None = a linear head.",
            "group": "Policy learning (MARLHF)",
        },
    )
    value_head_hidden_dim: int | None = field(
        default=None,
        metadata={
            "help": "Hidden width of the value head on iac actors; None = a linear head.",
            "group": "Policy learning (MARLHF)",
        },
    )
    # Differs from CoMLRL: it reports nothing about Bradley-Terry fitting.
    bt_validation_fraction: float = field(
        default=0.1,
        kw_only=True,
        metadata={
            "help": "Share of preference pairs held out from Bradley-Terry fitting to report its validation loss and accuracy, in [0, 0.5). 0 fits on every pair.",
            "group": "Reward model (MARLHF)",
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        algorithm = _choose(self, "rl_algorithm")
        if algorithm in MAGRPO_FAMILY_ADVANTAGE_MODE:
            if not _is_int(self.num_generations) or self.num_generations < 2:
                raise ConfigError(
                    "num_generations must be >= 2 for MAGRPO-family MARLHF backends.",
                    field="num_generations",
                    value=self.num_generations,
                )
        else:
            check_bound(self, "num_generations")
        check_bound(self, "reward_learning_rate")
        check_bound(self, "reward_num_train_epochs")
        check_bound(self, "reward_train_batch_size")
        check_bound(self, "reward_max_length")
        check_bound(self, "critic_learning_rate")
        _choose(self, "critic_type")
        check_bound(self, "value_loss_coef")
        check_bound(self, "value_clip_range")
        if not _is_number(self.bt_validation_fraction) or not 0 <= self.bt_validation_fraction < 0.5:
            raise ConfigError(
                "bt_validation_fraction must be in [0, 0.5).",
                field="bt_validation_fraction",
                value=self.bt_validation_fraction,
            )
        if algorithm in MAGRPO_FAMILY_ADVANTAGE_MODE:
            self.advantage_mode = MAGRPO_FAMILY_ADVANTAGE_MODE[algorithm]
