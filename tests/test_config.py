"""The four preference configs: CoMLRL 1.4.3 defaults, aliases and messages, our fields, serialisation."""

from __future__ import annotations

import copy
import json
import pickle
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from comlrl_lab.trainers.preference.config import (
    CONFIG_CLASSES,
    DEFAULT_JUDGE_TEMPLATE,
    DEFAULT_LABEL_GUIDELINE,
    ConfigError,
    MADPOConfig,
    MADPOIterConfig,
    MARLHFConfig,
    MARLHFIterConfig,
)

ALL = [MADPOConfig, MARLHFConfig, MADPOIterConfig, MARLHFIterConfig]
ITER = [MADPOIterConfig, MARLHFIterConfig]
MARLHF = [MARLHFConfig, MARLHFIterConfig]

MADPO_DEFAULTS = {
    "num_train_epochs": 20,
    "agent_learning_rate": 5e-6,
    "logging_steps": 50,
    "num_agents": 2,
    "collaboration_mode": "decentralized",
    "parallel_training": "none",
    "agent_devices": None,
    "max_new_tokens": 256,
    "temperature": 0.6,
    "top_p": 0.6,
    "top_k": 50,
    "num_turns": 1,
    "discount": 1.0,
    "joint_mode": "aligned",
    "early_termination_threshold": None,
    "external_prompt_passthrough": False,
    "eval_interval": 16,
    "eval_num_samples": 4,
    "eval_batch_size": 1,
    "rollout_buffer_size": 2,
    "train_batch_size": 2,  # None -> rollout_buffer_size
    "advantage_normalization": True,
    "advantage_mode": "mean",
    "reference_kl_enabled": False,
    "reference_kl_coef": 0.1,
    "reference_devices": None,
    "preference_num_candidates": 80,
    "preference_pairs_per_sample": 16,
    "pair_selection": "reward_gap",
    "dpo_beta": 0.1,
    "use_environment_step": True,
    "environment_steps_per_pair": 2,
}
OUR_MADPO_DEFAULTS = {
    "seed": 42,
    "disable_dropout": True,
    "score_final_token": False,
    "generation_batch_size": None,
    "scoring_batch_size": 16,
    "pack_pair_scoring": True,
    "output_dir": None,
    "madpo_reference": "none",
    "madpo_length_normalize": False,
    "madpo_nll_weight": 0.0,
    "eval_samples_per_item": 1,
    "max_grad_norm": None,
    "report_to": None,
    "save_strategy": "phase",
    "save_total_limit": None,
    "concurrent_cpu_agents": False,
    "keep_freed_host_memory": True,
    "gc_freeze_during_steps": True,
    "cpu_matmul": "torch",
    "save_in_background": False,
    "adamw_implementation": "fused",
    "batch_invariant_sampling": True,
    "use_chat_template": "auto",
    "lora_r": None,
    "lora_alpha": 16.0,
    "lora_dropout": 0.0,
    "lora_target_modules": None,
    "gradient_checkpointing": False,
    "preference_source": "reward",
    "labels_per_comparison": 1,
    "label_guideline": DEFAULT_LABEL_GUIDELINE,
    "judge_api_url": None,
    "judge_api_format": "openai",
    "judge_api_model": None,
    "judge_api_key_env": None,
    "judge_template": DEFAULT_JUDGE_TEMPLATE,
    "judge_max_new_tokens": 16,
    "judge_api_timeout": 60.0,
    "judge_api_max_retries": 3,
    "judge_api_max_concurrency": 8,
}
MARLHF_DEFAULTS = {
    "rl_algorithm": "magrpo",
    "num_generations": 4,
    "reward_model_name": None,
    "reward_model_device": None,  # Differs from CoMLRL ("cuda:0")
    "reward_learning_rate": 1e-5,
    "reward_num_train_epochs": 1,
    "reward_train_batch_size": 1,
    "reward_max_length": None,
    "reward_freeze_backbone": False,
    "critic_model_name": None,
    "critic_learning_rate": None,
    "critic_devices": None,
    "use_separate_critic": True,
    "critic_type": "v",
    "value_loss_coef": 0.6,
    "value_clip_range": 0.2,
    "critic_value_head_hidden_dim": None,
    "value_head_hidden_dim": None,
    "bt_validation_fraction": 0.1,
}
ITER_DEFAULTS = {
    "num_iterations": 6,
    "preference_replay_mode": "current",
    "preference_replay_k": None,
    "preference_replay_lambda": None,
    "preference_replay_sample_size": None,
    "preference_replay_dir": None,
    "log_reward_distribution": False,
    "policy_checkpoint_dir": None,
    "comparator_policy": "current",
    "comparator_generation_mode": "decentralized",
    "comparator_centralized_agent_index": 0,
    "comparator_model_name": None,
    "comparator_agents": None,
    "comparator_devices": None,
    "comparator_num_candidates": None,
    "comparator_history_k": None,
    "comparator_api_url": None,
    "comparator_api_format": "generic",
    "comparator_api_model": None,
    "comparator_api_max_n_per_request": None,
    "comparator_api_timeout": 120.0,
    "comparator_api_headers": None,
    "comparator_api_key": None,
    "comparator_api_key_env": None,
    "comparator_api_key_header": "Authorization",
    "comparator_api_key_prefix": "Bearer",
    "comparator_api_response_field": "completions",
    "comparator_api_extra_body": None,
    "comparator_api_max_concurrency": 8,
    "comparator_api_max_retries": 3,
    "comparator_api_backoff_base": 0.5,
    "comparator_api_backoff_max": 60.0,
    "comparator_api_retry_after_max": 60.0,
    "comparator_api_max_response_bytes": 16 * 1024 * 1024,
}
ITER_OVERRIDES = {"num_train_epochs": 1, "preference_num_candidates": 20, "preference_pairs_per_sample": 4}


def expected_defaults(cls: type) -> dict:
    expected = {**MADPO_DEFAULTS, **OUR_MADPO_DEFAULTS}
    if issubclass(cls, MARLHFConfig):
        expected |= MARLHF_DEFAULTS
    if cls in ITER:
        expected |= ITER_DEFAULTS | ITER_OVERRIDES | {"pair_selection": "comparator_reward"}
    if cls is MARLHFIterConfig:
        expected |= {"num_train_epochs": 2, "reward_num_train_epochs": 2, "preference_scoring_reward": "task"}
    return expected


# ---- defaults, layout -------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL)
def test_defaults_are_complete_and_match(cls):
    config = cls()
    expected = expected_defaults(cls)
    assert {f.name for f in fields(cls)} == set(expected)
    assert {name: getattr(config, name) for name in expected} == expected


def test_marlhf_iter_overrides():
    config = MARLHFIterConfig()
    assert (config.num_train_epochs, config.reward_num_train_epochs) == (2, 2)
    assert (config.preference_num_candidates, config.preference_pairs_per_sample) == (20, 4)
    assert config.pair_selection == "comparator_reward"
    assert config.preference_scoring_reward == "task"
    assert MADPOIterConfig().num_train_epochs == 1
    assert not hasattr(MADPOIterConfig(), "preference_scoring_reward")


def test_class_hierarchy_runs_iterative_checks_after_base_checks():
    assert issubclass(MARLHFConfig, MADPOConfig)
    mro = [c.__name__ for c in MARLHFIterConfig.__mro__]
    assert mro[:4] == ["MARLHFIterConfig", "_IterativePreferenceConfig", "MARLHFConfig", "MADPOConfig"]
    # Both the base check and the iterative check fail: the base message wins.
    with pytest.raises(ValueError, match=re.escape("num_train_epochs must be >= 1.")):
        MADPOIterConfig(num_train_epochs=0, num_iterations=0)
    with pytest.raises(ValueError, match=re.escape("rl_algorithm must be one of")):
        MARLHFIterConfig(rl_algorithm="ppo", num_iterations=0)


def test_our_fields_are_keyword_only_so_comlrl_positional_order_holds():
    names = [f.name for f in fields(MADPOConfig) if not f.kw_only]
    assert names == list(MADPO_DEFAULTS)
    assert MADPOConfig(3).num_train_epochs == 3
    marlhf_positional = [f.name for f in fields(MARLHFConfig) if not f.kw_only]
    assert marlhf_positional[len(MADPO_DEFAULTS)] == "rl_algorithm"


def test_config_classes_table():
    expected = {
        "MADPO": MADPOConfig,
        "MARLHF": MARLHFConfig,
        "MADPOIter": MADPOIterConfig,
        "MARLHFIter": MARLHFIterConfig,
    }
    assert expected == CONFIG_CLASSES


@pytest.mark.parametrize("cls", ALL)
def test_every_field_has_help(cls):
    helps = cls.field_help()
    assert list(helps) == [f.name for f in fields(cls)]
    assert all(isinstance(text, str) and text.strip() for text in helps.values())


def test_config_module_does_not_import_torch():
    # The config package on its own, in a fresh process: building and serialising a config needs no torch.
    code = (
        "import sys\n"
        "from comlrl_lab.trainers.preference.config import MARLHFIterConfig\n"
        "MARLHFIterConfig().to_dict()\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# ---- validation messages ----------------------------------------------------------------------------------

MADPO_ERRORS = [
    # checked at construction by name (issue 15), not after the models have loaded
    ({"joint_mode": "shuffled"}, "preference generation currently supports aligned joint_mode only."),
    ({"max_new_tokens": "64"}, "max_new_tokens must be an integer, got '64'."),
    ({"max_new_tokens": 0}, "max_new_tokens must be >= 1."),
    ({"max_new_tokens": -5}, "max_new_tokens must be >= 1."),
    ({"temperature": 0}, "temperature must be > 0."),
    ({"temperature": -1.0}, "temperature must be > 0."),
    ({"top_p": 0}, "top_p must be in (0, 1], got 0."),
    ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5."),
    ({"top_k": -1}, "top_k must be >= 0."),
    ({"agent_learning_rate": "1e-3"}, "agent_learning_rate must be a number >= 0, got '1e-3'."),
    ({"agent_learning_rate": -1e-3}, "agent_learning_rate must be a number >= 0, got -0.001."),
    ({"collaboration_mode": "joint"}, "collaboration_mode must be decentralized or centralized."),
    ({"num_train_epochs": 0}, "num_train_epochs must be >= 1."),
    ({"num_agents": 0}, "num_agents must be >= 1."),
    ({"rollout_buffer_size": 0}, "rollout_buffer_size must be >= 1."),
    ({"eval_interval": -1}, "eval_interval must be >= 0."),
    ({"eval_num_samples": -1}, "eval_num_samples must be >= 0."),
    ({"eval_batch_size": 0}, "eval_batch_size must be >= 1."),
    ({"num_turns": 0}, "num_turns must be >= 1."),
    ({"logging_steps": 0}, "logging_steps must be >= 1."),
    ({"train_batch_size": 0}, "train_batch_size must be >= 1."),
    ({"parallel_training": "ddp"}, "parallel_training only supports: none, mp."),
    ({"parallel_training": "mp"}, "parallel_training='mp' requires explicit agent_devices."),
    ({"reference_kl_coef": -0.1}, "reference_kl_coef must be >= 0."),
    (
        {"reference_kl_enabled": True, "reference_devices": ["cpu", "cpu", "cpu"]},
        "reference_devices length (3) must be 1 or 2.",
    ),
    ({"num_turns": 2}, "MADPO currently supports num_turns=1 only."),
    ({"preference_num_candidates": 1}, "preference_num_candidates must be >= 2."),
    ({"preference_pairs_per_sample": 0}, "preference_pairs_per_sample must be >= 1 or null."),
    ({"dpo_beta": 0.0}, "dpo_beta must be > 0."),
    ({"dpo_beta": -1}, "dpo_beta must be > 0."),
    ({"environment_steps_per_pair": 0}, "environment_steps_per_pair must be >= 1."),
    ({"pair_selection": "all"}, "preference_pairs_per_sample must be null when pair_selection='all'."),
    # Our fields.
    ({"seed": -1}, "seed must be >= 0."),
    ({"generation_batch_size": 0}, "generation_batch_size must be >= 1."),
    ({"scoring_batch_size": 0}, "scoring_batch_size must be >= 1."),
    ({"max_grad_norm": 0.0}, "max_grad_norm must be > 0."),
    ({"madpo_reference": "final"}, "madpo_reference must be one of: none, initial."),
    ({"adamw_implementation": "adam"}, "adamw_implementation must be one of: fused, foreach, for_loop."),
    ({"cpu_matmul": "mkl"}, "cpu_matmul must be one of: torch, onednn."),
    ({"use_chat_template": "maybe"}, "use_chat_template must be one of: auto, true, false."),
    ({"madpo_length_normalize": "yes"}, "madpo_length_normalize must be true or false, got 'yes'."),
    ({"madpo_nll_weight": -0.1}, "madpo_nll_weight must be a finite number >= 0."),
    ({"madpo_nll_weight": float("inf")}, "madpo_nll_weight must be a finite number >= 0."),
    ({"lora_r": 0}, "lora_r must be >= 1."),
    ({"lora_alpha": 0}, "lora_alpha must be > 0."),
    ({"lora_dropout": 1.0}, "lora_dropout must be in [0, 1)"),
    ({"lora_target_modules": []}, "lora_target_modules must be None"),
    ({"num_train_epochs": "3"}, "num_train_epochs must be an integer, got '3'."),
    ({"num_train_epochs": True}, "num_train_epochs must be an integer, got True."),
]

# The Iter configs add comparator_reward, so their message lists it (ITER_ERRORS).
NON_ITER_ERRORS = [
    ({"pair_selection": "best"}, "pair_selection must be one of: reward_gap, all, random."),
    ({"pair_selection": "comparator_reward"}, "pair_selection must be one of: reward_gap, all, random."),
]

MARLHF_ERRORS = [
    ({"rl_algorithm": "ppo"}, "rl_algorithm must be one of: magrpo, mareinforce, maremax, marloo, maac, iac."),
    ({"num_generations": 1}, "num_generations must be >= 2 for MAGRPO-family MARLHF backends."),
    (
        {"rl_algorithm": "marloo", "num_generations": 1},
        "num_generations must be >= 2 for MAGRPO-family MARLHF backends.",
    ),
    ({"rl_algorithm": "iac", "num_generations": 0}, "num_generations must be >= 1."),
    ({"reward_learning_rate": 0.0}, "reward_learning_rate must be > 0."),
    ({"reward_num_train_epochs": 0}, "reward_num_train_epochs must be >= 1."),
    ({"reward_train_batch_size": 0}, "reward_train_batch_size must be >= 1."),
    ({"reward_max_length": 0}, "reward_max_length must be >= 1 or null."),
    ({"critic_learning_rate": 0.0}, "critic_learning_rate must be > 0."),
    ({"critic_type": "a"}, "critic_type must be one of: v, q."),
    ({"value_loss_coef": 0.0}, "value_loss_coef must be > 0."),
    ({"value_clip_range": 0.0}, "value_clip_range must be > 0."),
    ({"bt_validation_fraction": 0.5}, "bt_validation_fraction must be in [0, 0.5)."),
    ({"bt_validation_fraction": -0.1}, "bt_validation_fraction must be in [0, 0.5)."),
]

SAMPLE_SIZE_ONLY = (
    "preference_replay_sample_size is only valid when preference_replay_mode is "
    "'nearest_k', 'all_history', or 'lambda_decay'."
)
K_ONLY = "preference_replay_k is only valid when preference_replay_mode='nearest_k'."
LAMBDA_ONLY = "preference_replay_lambda is only valid when preference_replay_mode='lambda_decay'."
MODEL_ONLY = "comparator_model_name and comparator_agents are only valid when comparator_policy='model'."
HISTORY_ONLY = "comparator_history_k is only valid when comparator_policy='history'."

ITER_ERRORS = [
    ({"num_iterations": 0}, "num_iterations must be >= 1."),
    ({"pair_selection": "best"}, "pair_selection must be one of: reward_gap, all, random, comparator_reward."),
    (
        {"collaboration_mode": "centralized", "comparator_centralized_agent_index": 1},
        "Centralized collaboration has only actor index 0.",
    ),
    # replay: current
    (
        {"preference_replay_mode": "warm"},
        "preference_replay_mode must be one of: current, nearest_k, all_history, lambda_decay.",
    ),
    ({"preference_replay_k": 2}, "preference_replay_k must be null or 1 when preference_replay_mode='current'."),
    ({"preference_replay_lambda": 0.5}, LAMBDA_ONLY),
    ({"preference_replay_sample_size": 8}, SAMPLE_SIZE_ONLY),
    # replay: nearest_k
    (
        {"preference_replay_mode": "nearest_k"},
        "preference_replay_k is required when preference_replay_mode='nearest_k'.",
    ),
    ({"preference_replay_mode": "nearest_k", "preference_replay_k": 0}, "preference_replay_k must be >= 1."),
    ({"preference_replay_mode": "nearest_k", "preference_replay_k": 2, "preference_replay_lambda": 0.5}, LAMBDA_ONLY),
    (
        {"preference_replay_mode": "nearest_k", "preference_replay_k": 2, "preference_replay_sample_size": 0},
        "preference_replay_sample_size must be >= 1.",
    ),
    # replay: all_history
    ({"preference_replay_mode": "all_history", "preference_replay_k": 2}, K_ONLY),
    ({"preference_replay_mode": "all_history", "preference_replay_lambda": 0.5}, LAMBDA_ONLY),
    (
        {"preference_replay_mode": "all_history", "preference_replay_sample_size": 0},
        "preference_replay_sample_size must be >= 1.",
    ),
    # replay: lambda_decay
    ({"preference_replay_mode": "lambda_decay", "preference_replay_k": 2, "preference_replay_lambda": 0.5}, K_ONLY),
    (
        {"preference_replay_mode": "lambda_decay"},
        "preference_replay_lambda is required when preference_replay_mode='lambda_decay'.",
    ),
    (
        {"preference_replay_mode": "lambda_decay", "preference_replay_lambda": 1.5},
        "preference_replay_lambda must be in [0, 1].",
    ),
    (
        {"preference_replay_mode": "lambda_decay", "preference_replay_lambda": -0.1},
        "preference_replay_lambda must be in [0, 1].",
    ),
    (
        {"preference_replay_mode": "lambda_decay", "preference_replay_lambda": 0.5, "preference_replay_sample_size": 0},
        "preference_replay_sample_size must be >= 1.",
    ),
    # comparator generation, counts
    ({"comparator_generation_mode": "hive"}, "comparator_generation_mode must be one of: decentralized, centralized."),
    (
        {"comparator_generation_mode": "centralized", "comparator_centralized_agent_index": 2},
        "comparator_centralized_agent_index must be in [0, 2).",
    ),
    (
        {"comparator_generation_mode": "centralized", "comparator_centralized_agent_index": -1},
        "comparator_centralized_agent_index must be in [0, 2).",
    ),
    ({"comparator_num_candidates": 0}, "comparator_num_candidates must be >= 1 or null."),
    ({"comparator_api_max_n_per_request": 0}, "comparator_api_max_n_per_request must be >= 1."),
    # comparator policies
    ({"comparator_policy": "rival"}, "comparator_policy must be one of: current, current_copy, model, history, api."),
    (
        {"comparator_policy": "model"},
        "comparator_model_name or comparator_agents is required when comparator_policy='model'.",
    ),
    ({"comparator_policy": "model", "comparator_model_name": "m", "comparator_history_k": 1}, HISTORY_ONLY),
    ({"comparator_policy": "history", "comparator_history_k": 0}, "comparator_history_k must be >= 1."),
    ({"comparator_policy": "history", "comparator_model_name": "m"}, MODEL_ONLY),
    ({"comparator_policy": "history", "comparator_agents": ["m", "m"]}, MODEL_ONLY),
    ({"comparator_history_k": 1}, HISTORY_ONLY),
    ({"comparator_model_name": "m"}, MODEL_ONLY),
    ({"comparator_policy": "current_copy", "comparator_agents": ["m", "m"]}, MODEL_ONLY),
    ({"comparator_policy": "current_copy", "comparator_history_k": 2}, HISTORY_ONLY),
    ({"comparator_policy": "api", "comparator_api_url": "http://x", "comparator_history_k": 1}, HISTORY_ONLY),
    ({"comparator_policy": "api"}, "comparator_api_url is required when comparator_policy='api'."),
    (
        {"comparator_policy": "api", "comparator_api_url": ""},
        "comparator_api_url is required when comparator_policy='api'.",
    ),
    # our API fields
    ({"comparator_api_timeout": 0}, "comparator_api_timeout must be > 0."),
    ({"comparator_api_max_concurrency": 0}, "comparator_api_max_concurrency must be >= 1."),
    ({"comparator_api_max_retries": -1}, "comparator_api_max_retries must be >= 0."),
    ({"comparator_api_backoff_base": 0}, "comparator_api_backoff_base must be > 0."),
    ({"comparator_api_backoff_max": 0}, "comparator_api_backoff_max must be > 0."),
    ({"comparator_api_retry_after_max": -1}, "comparator_api_retry_after_max must be > 0."),
    ({"comparator_api_max_response_bytes": 0}, "comparator_api_max_response_bytes must be >= 1."),
    (
        {"comparator_api_url": "ftp://user:pw@h/x"},
        "comparator_api_url must be an http(s) URL with a host, got scheme 'ftp'.",
    ),
    ({"comparator_api_url": "localhost:8000/v1"}, "must be an http(s) URL with a host"),
]


def _cases(errors, classes):
    return [
        pytest.param(cls, kwargs, msg, id=f"{cls.__name__}-{msg[:50]}") for cls in classes for kwargs, msg in errors
    ]


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    _cases(MADPO_ERRORS, ALL)
    + _cases(NON_ITER_ERRORS, [MADPOConfig, MARLHFConfig])
    + _cases(MARLHF_ERRORS, MARLHF)
    + _cases(ITER_ERRORS, ITER),
)
def test_validation_message(cls, kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as raised:
        cls(**kwargs)
    # The error names its field itself: one of the config's, named in the message (the centralized-index rule's
    # message names no field), holding the value refused when the caller gave that field (URLs may hold a secret).
    error = raised.value
    assert error.field in {f.name for f in fields(cls)}
    assert error.field in str(error) or error.field == "comparator_centralized_agent_index"
    if error.field in kwargs and error.field != "comparator_api_url":
        assert error.value == kwargs[error.field]


def test_a_config_error_keeps_its_field_value_and_suggestion_through_pickle():
    with pytest.raises(ConfigError) as raised:
        MADPOIterConfig(comparator_api_format="antropic")
    again = pickle.loads(pickle.dumps(raised.value))  # what a worker process hands back
    assert isinstance(again, ValueError) and str(again) == str(raised.value)
    assert (again.field, again.value, again.suggestion) == ("comparator_api_format", "antropic", "anthropic")


def test_preference_scoring_reward_message():
    with pytest.raises(ValueError, match=re.escape("preference_scoring_reward must be one of: task, reward_model.")):
        MARLHFIterConfig(preference_scoring_reward="judge")


# ---- accepted values, normalisation -----------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL)
def test_normalisations_of_base_fields(cls):
    config = cls(pair_selection="  RANDOM ", parallel_training=" NULL ", rollout_buffer_size=5)
    assert config.pair_selection == "random"
    assert config.parallel_training == "none"
    assert config.train_batch_size == 5
    assert cls(parallel_training="MP", agent_devices=["cpu", "cpu"]).parallel_training == "mp"
    assert cls(train_batch_size=3).train_batch_size == 3
    assert cls(pair_selection="all", preference_pairs_per_sample=None).preference_pairs_per_sample is None
    assert cls(preference_pairs_per_sample=None).preference_pairs_per_sample is None
    # Reference devices: one string, a list of 1 or num_agents, or anything when KL is off.
    assert cls(reference_kl_enabled=True, reference_devices="cpu").reference_devices == "cpu"
    assert cls(reference_kl_enabled=True, reference_devices=["cpu"]).reference_devices == ["cpu"]
    assert cls(reference_kl_enabled=True, reference_devices=["cpu", "cpu"]).reference_devices == ["cpu", "cpu"]
    assert cls(reference_devices=["cpu", "cpu", "cpu"]).reference_devices == ["cpu", "cpu", "cpu"]
    assert cls(reference_kl_coef=0).reference_kl_coef == 0
    assert cls(eval_interval=0, eval_num_samples=0).eval_interval == 0


def test_centralized_reference_devices_count_one_actor():
    config = MADPOConfig(collaboration_mode="centralized", reference_kl_enabled=True, reference_devices=["cpu"])
    assert config.reference_devices == ["cpu"]
    with pytest.raises(ValueError, match=re.escape("reference_devices length (2) must be 1 or 1.")):
        MADPOConfig(collaboration_mode="centralized", reference_kl_enabled=True, reference_devices=["cpu", "cpu"])


@pytest.mark.parametrize("cls", ITER)
def test_centralized_collaboration_forces_centralized_comparator(cls):
    config = cls(collaboration_mode="centralized", comparator_generation_mode="decentralized")
    assert config.comparator_generation_mode == "centralized"
    assert (
        cls(
            comparator_generation_mode="centralized", comparator_centralized_agent_index=1
        ).comparator_centralized_agent_index
        == 1
    )


@pytest.mark.parametrize("cls", ITER)
def test_iter_pair_selection_accepts_comparator_reward(cls):
    assert cls(pair_selection=" Comparator_Reward ").pair_selection == "comparator_reward"
    assert cls(pair_selection="all", preference_pairs_per_sample=None).pair_selection == "all"


@pytest.mark.parametrize(
    ("algorithm", "canonical", "advantage_mode"),
    [
        ("magrpo", "magrpo", "mean"),
        ("MAREINFORCE", "mareinforce", "raw"),
        ("mareforce", "mareinforce", "raw"),
        ("maremax", "maremax", "max"),
        ("marloo", "marloo", "rloo"),
        ("maac", "maac", "custom"),
        ("IAC", "iac", "custom"),
    ],
)
@pytest.mark.parametrize("cls", MARLHF)
def test_rl_algorithm_aliases_and_advantage_mode_overwrite(cls, algorithm, canonical, advantage_mode):
    config = cls(rl_algorithm=algorithm, advantage_mode="custom")
    assert config.rl_algorithm == canonical
    assert config.advantage_mode == advantage_mode


@pytest.mark.parametrize("cls", MARLHF)
def test_marlhf_accepted_edges(cls):
    assert cls(rl_algorithm="maac", num_generations=1).num_generations == 1
    assert cls(critic_type=" Q ").critic_type == "q"
    config = cls(reward_max_length=16, critic_learning_rate=1e-4, value_clip_range=None, bt_validation_fraction=0)
    assert (config.reward_max_length, config.critic_learning_rate, config.value_clip_range) == (16, 1e-4, None)
    assert cls(reward_model_device="cpu").reward_model_device == "cpu"


ALIASES = {
    "comparator_policy": {
        "current": ["current", "self", "online", " Online "],
        "current_copy": ["current_copy", "copy", "online_copy", "current-offload", "current_offload"],
        "history": ["history", "checkpoint", "previous", "previous_iteration", "HISTORY"],
    },
    "comparator_generation_mode": {
        "decentralized": ["decentralized", "decentralised", "multi_agent", "multi-agent"],
        "centralized": ["centralized", "centralised", "single_agent", "single-agent", " Centralised "],
    },
    "comparator_api_format": {
        "generic": ["generic", "GENERIC", " Generic "],
        "openai": ["openai", "openai_chat", "chat", "OpenAI"],
        "anthropic": ["anthropic", "anthropic_messages", "messages"],
        "openai_responses": ["openai_responses", "responses", "codex"],
    },
}


def _alias_cases():
    for name, table in ALIASES.items():
        for canonical, spellings in table.items():
            for spelling in spellings:
                yield pytest.param(name, spelling, canonical, id=f"{name}-{spelling!r}")


@pytest.mark.parametrize(("name", "spelling", "canonical"), list(_alias_cases()))
@pytest.mark.parametrize("cls", ITER)
def test_alias_normalisation(cls, name, spelling, canonical):
    assert getattr(cls(**{name: spelling}), name) == canonical


@pytest.mark.parametrize("cls", ITER)
@pytest.mark.parametrize("spelling", ["model", "external", "comparator", "reference", "ref"])
def test_model_policy_aliases(cls, spelling):
    assert cls(comparator_policy=spelling, comparator_model_name="m").comparator_policy == "model"


@pytest.mark.parametrize("cls", ITER)
@pytest.mark.parametrize("spelling", ["api", "http", "endpoint"])
def test_api_policy_aliases(cls, spelling):
    assert cls(comparator_policy=spelling, comparator_api_url="http://x").comparator_policy == "api"


REPLAY_ALIASES = [
    ("current", {}, ["current", "latest", "new", " LATEST "]),
    ("nearest_k", {"preference_replay_k": 2}, ["nearest_k", "recent_k", "last_k", "k"]),
    ("all_history", {}, ["all_history", "All_History"]),
    ("lambda_decay", {"preference_replay_lambda": 0.5}, ["lambda", "lambda_decay", "td_lambda", "td-lambda"]),
]


@pytest.mark.parametrize("cls", ITER)
@pytest.mark.parametrize(("canonical", "extra", "spellings"), REPLAY_ALIASES)
def test_replay_mode_aliases(cls, canonical, extra, spellings):
    for spelling in spellings:
        assert cls(preference_replay_mode=spelling, **extra).preference_replay_mode == canonical


@pytest.mark.parametrize(
    ("spelling", "canonical"),
    [
        ("task", "task"),
        ("oracle", "task"),
        ("Environment", "task"),
        ("env", "task"),
        ("reward_model", "reward_model"),
        ("model", "reward_model"),
        (" LEARNED ", "reward_model"),
    ],
)
def test_preference_scoring_reward_aliases(spelling, canonical):
    assert MARLHFIterConfig(preference_scoring_reward=spelling).preference_scoring_reward == canonical


@pytest.mark.parametrize("cls", ITER)
def test_replay_and_comparator_accepted_settings(cls):
    assert cls(preference_replay_k=1).preference_replay_k == 1
    config = cls(preference_replay_mode="nearest_k", preference_replay_k=3, preference_replay_sample_size=10)
    assert (config.preference_replay_k, config.preference_replay_sample_size) == (3, 10)
    assert cls(preference_replay_mode="all_history", preference_replay_sample_size=1).preference_replay_sample_size == 1
    for lam in (0, 0.0, 0.5, 1, 1.0):
        assert cls(preference_replay_mode="lambda_decay", preference_replay_lambda=lam).preference_replay_lambda == lam
    assert cls(comparator_policy="history").comparator_history_k == 1  # None -> 1
    assert cls(comparator_policy="history", comparator_history_k=3).comparator_history_k == 3
    assert cls(comparator_policy="model", comparator_agents=["a", "b"]).comparator_agents == ["a", "b"]
    # CoMLRL only rejects history_k for api; model fields ride along unused.
    assert (
        cls(comparator_policy="api", comparator_api_url="http://x", comparator_model_name="m").comparator_model_name
        == "m"
    )
    assert cls(comparator_num_candidates=1, comparator_api_max_n_per_request=1).comparator_num_candidates == 1
    assert cls(comparator_api_max_retries=0).comparator_api_max_retries == 0


# ---- serialisation and the API key ------------------------------------------------------------------------


def _api_config(cls=MARLHFIterConfig):
    return cls(
        comparator_policy="api",
        comparator_api_url="https://u:SECRET-PW@api.example.com/v1/chat/completions?api_key=SECRET-Q&mode=fast",
        comparator_api_format="chat",
        comparator_api_key="sk-SECRET-123",
        comparator_api_key_header="X-Token",
        comparator_api_headers={
            "Authorization": "Bearer sk-SECRET-456",
            "x-token": "sk-SECRET-789",
            "X-Trace": "SECRET-custom",
            "X-Env": "Bearer ${MY_TOKEN}",
        },
        comparator_api_extra_body={"stop": ["\n"]},
    )


@pytest.mark.parametrize("cls", ITER)
def test_api_key_never_serialised(cls):
    config = _api_config(cls)
    assert config.comparator_api_key == "sk-SECRET-123"  # still usable in memory
    data = config.to_dict()
    assert "comparator_api_key" not in data
    # Every literal header value is masked, whatever the header's name; an ${ENV} reference holds no secret.
    masked = {"Authorization": "***", "x-token": "***", "X-Trace": "***", "X-Env": "Bearer ${MY_TOKEN}"}
    assert data["comparator_api_headers"] == masked
    assert data["comparator_api_url"] == "https://***@api.example.com/v1/chat/completions?api_key=***&mode=fast"
    assert "SECRET" not in json.dumps(data)
    assert "SECRET" not in repr(config) and "SECRET" not in str(config)
    assert "comparator_api_key='***'" in repr(config)
    assert "'Authorization': '***'" in repr(config)
    # Pickles (torch.save, multiprocessing) drop the key too; in-memory copies keep it.
    assert b"SECRET" not in pickle.dumps(config)
    restored = pickle.loads(pickle.dumps(config))
    assert restored.comparator_api_key is None
    assert restored.comparator_api_headers == masked
    assert copy.deepcopy(config).comparator_api_key == "sk-SECRET-123"
    assert copy.copy(config).comparator_api_key == "sk-SECRET-123"
    assert config.comparator_api_headers["Authorization"] == "Bearer sk-SECRET-456"  # the original is untouched


def test_repr_without_key_shows_none():
    assert "comparator_api_key=None" in repr(MADPOIterConfig())
    assert repr(MADPOConfig()).startswith("MADPOConfig(num_train_epochs=20, ")


def _non_default(cls):
    kwargs = {"seed": 7, "num_agents": 3, "pair_selection": "random", "output_dir": "runs/x", "max_grad_norm": 1.0}
    if issubclass(cls, MARLHFConfig):
        kwargs |= {"rl_algorithm": "mareforce", "reward_model_device": "cpu", "critic_devices": ["cpu"]}
    if cls in ITER:
        kwargs |= {
            "comparator_policy": "model",
            "comparator_agents": ["a", "b", "c"],
            "comparator_api_headers": {"X-Trace": "${TRACE_ID}"},
            "preference_replay_mode": "td-lambda",
            "preference_replay_lambda": 0.25,
        }
    if cls is MARLHFIterConfig:
        kwargs["preference_scoring_reward"] = "learned"
    return kwargs


@pytest.mark.parametrize("cls", ALL)
def test_round_trip(cls):
    config = cls(**_non_default(cls))
    data = json.loads(json.dumps(config.to_dict()))
    again = cls.from_dict(data)
    assert again == config
    assert again.to_dict() == data
    assert cls.from_dict({}) == cls()


def test_round_trip_drops_only_the_secrets():
    config = _api_config()
    again = MARLHFIterConfig.from_dict(config.to_dict())
    assert again.comparator_api_key is None
    assert again.comparator_api_format == "openai"
    assert again.comparator_api_extra_body == {"stop": ["\n"]}


def test_from_dict_rejects_unknown_keys():
    with pytest.raises(ConfigError, match=re.escape("MADPOConfig has no fields 'rl_algorithm', 'bogus'.")) as error:
        MADPOConfig.from_dict({"rl_algorithm": "magrpo", "bogus": 1, "seed": 1})
    assert error.value.field == "rl_algorithm"
    with pytest.raises(
        ConfigError, match=re.escape("MADPOConfig has no field 'dpo_bta'; did you mean 'dpo_beta'?")
    ) as error:
        MADPOConfig.from_dict({"dpo_bta": 0.2})
    assert (error.value.field, error.value.suggestion) == ("dpo_bta", "dpo_beta")


def test_from_dict_validates():
    with pytest.raises(ValueError, match=re.escape("dpo_beta must be > 0.")):
        MADPOConfig.from_dict({"dpo_beta": 0})


def test_model_objects_serialise_as_their_id():
    class FakeModel:
        class config:  # noqa: N801 - mimics transformers' model.config
            _name_or_path = "org/tiny"

    config = MADPOIterConfig(comparator_policy="model", comparator_agents=[FakeModel(), "org/other"])
    assert config.to_dict()["comparator_agents"] == ["org/tiny", "org/other"]
    anonymous = MADPOIterConfig(comparator_policy="model", comparator_agents=[object()])
    with pytest.raises(ValueError, match=re.escape("comparator_agents[0] holds a object without a model id")):
        anonymous.to_dict()


@pytest.mark.parametrize(
    ("value", "canonical"), [("auto", "auto"), (True, "true"), (False, "false"), (" TRUE ", "true")]
)
def test_use_chat_template_reads_yaml_booleans_and_names(value, canonical):
    assert MADPOIterConfig(use_chat_template=value).use_chat_template == canonical


# ---- preference source (issue 26) ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "field", "message"),
    [
        (
            {"preference_source": "humans"},
            "preference_source",
            "preference_source must be one of: reward, human, judge.",
        ),
        ({"preference_source": "judge"}, "judge_api_url", "judge_api_url is required when preference_source='judge'."),
        (
            {"judge_api_url": "http://127.0.0.1:1/v1"},
            "judge_api_url",
            "judge_api_url is only valid when preference_source='judge'.",
        ),
        (
            {"preference_source": "human", "labels_per_comparison": 0},
            "labels_per_comparison",
            "labels_per_comparison must be >= 1.",
        ),
        (
            {"preference_source": "judge", "judge_api_url": "http://x", "judge_template": "{prompt} {response_a}"},
            "judge_template",
            "judge_template must contain {response_b}: the judge would not see what it compares.",
        ),
        (
            {"preference_source": "judge", "judge_api_url": "http://x", "judge_api_format": "opnai"},
            "judge_api_format",
            None,
        ),
    ],
)
def test_preference_source_refusals_name_their_field(values, field, message):
    with pytest.raises(ConfigError) as caught:
        MADPOConfig(**values)
    assert caught.value.field == field
    if message is not None:
        assert str(caught.value) == message


def test_judge_settings_resolve_aliases_and_mask_the_url():
    config = MADPOIterConfig(
        preference_source="judge",
        judge_api_url="https://me:sk-secret@judge.example/v1?api_key=sk-2",
        judge_api_format="chat",
    )
    assert config.judge_api_format == "openai"
    saved = config.to_dict()
    assert saved["judge_api_url"] == "https://***@judge.example/v1?api_key=***"
    assert "sk-secret" not in repr(config) and "sk-2" not in repr(config)


def _bounded_fields():
    from comlrl_lab.trainers.preference.config.validation import field_bound

    for cls in CONFIG_CLASSES.values():
        for f in fields(cls):
            bound = field_bound(cls, f.name)
            if bound is not None:
                yield pytest.param(cls, f.name, bound, id=f"{cls.__name__}.{f.name}")


#: What a bounded field needs around it to be checked on its own: a mode it applies under that requires nothing else,
#: or the backend whose bound is the declared one (the MAGRPO family asks for >= 2 generations, in its own words).
PREREQUISITES = {
    "preference_replay_sample_size": {"preference_replay_mode": "all_history"},
    "num_generations": {"rl_algorithm": "maac"},
}


def _where_it_applies(cls, name):
    """The settings under which ``name`` means something: its controlling field's first value, or PREREQUISITES."""
    settings = {
        c: values[0] for c, values in (cls.__dataclass_fields__[name].metadata.get("applies_when") or {}).items()
    }
    settings |= PREREQUISITES.get(name, {})
    if name.startswith("judge_") and "preference_source" in cls.__dataclass_fields__:
        settings |= {"preference_source": "judge", "judge_api_url": "http://127.0.0.1:9/v1"}
    if name.startswith("comparator_api_"):
        settings |= {"comparator_policy": "api", "comparator_api_url": "http://127.0.0.1:9/v1"}
    return settings


@pytest.mark.parametrize(("cls", "name", "bound"), list(_bounded_fields()))
def test_every_declared_bound_is_what_the_config_refuses(cls, name, bound):
    # The bound lives in the field's metadata; the config's check reads it there: the bound itself is accepted,
    # the value just past it refused in one line that names the field.
    base = _where_it_applies(cls, name)
    if "maximum" in bound:
        edge, past, words = bound["maximum"], bound["maximum"] + 0.5, f"{name} must be in ["
    elif "minimum" in bound:
        edge, past, words = bound["minimum"], bound["minimum"] - 1, f"{name} must be >= {bound['minimum']}"
    else:
        edge, past, words = 0.5, 0, f"{name} must be > 0."
    assert getattr(cls(**base, **{name: edge}), name) == edge
    with pytest.raises(ConfigError) as refused:
        cls(**base, **{name: past})
    assert refused.value.field == name and str(refused.value).startswith(words)


def test_no_config_writes_a_bound_by_hand():
    # Bounds are declared once, in metadata: the configs' checks call check_bound(self, name), never a literal bound.
    folder = Path(sys.modules[ConfigError.__module__].__file__).parent
    for module in ("madpo.py", "marlhf.py", "iterative.py"):
        text = (folder / module).read_text(encoding="utf-8")
        assert not re.search(r'_check_(int_at_least|positive)\("\w+"', text), module
