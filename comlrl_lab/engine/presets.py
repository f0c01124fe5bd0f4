"""Ready-made experiments: the quickstart presets (the embedded model) and the real-model preset (SmolLM2-135M).

CoMLRL's defaults (learning rate 5e-6, 20 to 80 candidates, 256 tokens) are sized for real models on GPUs; on the
1M-parameter embedded model and two CPU cores they run for a long time and learn nothing visible. The quickstart
presets are sized for that case: MADPOIter with the opt-in MADPO stabilisers (``benchmarks/learning.py --settings
combined`` measures it over seeds; ``examples/quickstart.yaml`` is the same spec as a file, a test keeps the two
equal), and MARLHFIter (``MARLHF_QUICKSTART_CONFIG``, as a file ``examples/marlhf_quickstart.yaml``;
``scripts/marlhf_curve.py --seeds 3`` measures it). ``preset_config(algorithm)`` gives the Setup form the preset of
the algorithm chosen. The real-model preset runs the MADPO quickstart's loss on SmolLM2-135M-Instruct
(``comlrl-lab models add smollm2-135m-instruct``) with LoRA adapters on both agents and its chat template; a round
takes about four minutes on two idle CPU cores, and ``benchmarks/learning.py --model smollm2-135m-instruct``
measures its rise over seeds (``examples/smollm2.yaml``). It only describes runs; it does not start them.
"""

from __future__ import annotations

from dataclasses import fields

from comlrl_lab.engine.spec import ExperimentSpec
from comlrl_lab.models.registry import SMOLLM2_135M_INSTRUCT
from comlrl_lab.models.tiny_model import TINY_MODEL_NAME

#: Training items per round and evaluation items (every item of a built-in task's eval split).
QUICKSTART_TRAIN_ITEMS = 32
QUICKSTART_EVAL_ITEMS = 60

#: The quickstart's config overrides (MADPOIterConfig fields by their CoMLRL names).
QUICKSTART_CONFIG: dict[str, object] = {
    "num_iterations": 5,
    "preference_num_candidates": 8,
    "preference_pairs_per_sample": 4,
    "pair_selection": "reward_gap",
    "num_train_epochs": 4,
    "train_batch_size": 8,
    "agent_learning_rate": 2.0e-4,
    "dpo_beta": 0.1,
    "max_new_tokens": 24,
    "temperature": 1.0,
    "top_p": 1.0,
    "eval_num_samples": QUICKSTART_EVAL_ITEMS,
    "eval_samples_per_item": 4,
    "comparator_policy": "current",
    "preference_replay_mode": "lambda_decay",
    "preference_replay_lambda": 0.5,
    "madpo_reference": "initial",
    "madpo_length_normalize": True,
    "madpo_nll_weight": 0.2,
    "agent_devices": "cpu",
    "seed": 0,
}


def _preset(name: str, model: str, task: str, train_items: int, config: dict[str, object]) -> ExperimentSpec:
    return ExperimentSpec(
        algorithm="MADPOIter",
        name=name,
        agent_models=[model, model],
        task=task,
        max_train_items=train_items,
        max_eval_items=int(config["eval_num_samples"]),
        config=dict(config),
    )


def quickstart_spec(task: str = "length_ratio") -> ExperimentSpec:
    """MADPOIter on the embedded model and a built-in task, sized to learn visibly in about two CPU minutes."""
    return _preset("quickstart", TINY_MODEL_NAME, task, QUICKSTART_TRAIN_ITEMS, QUICKSTART_CONFIG)


#: The registered name of the real-model preset's agents.
SMOLLM2_MODEL_NAME = SMOLLM2_135M_INSTRUCT.name
SMOLLM2_TRAIN_ITEMS = 12
SMOLLM2_EVAL_ITEMS = 16

#: The real-model preset's config: the quickstart's loss and comparator with these sizes. A round samples 12 items
#: x (4 + 4) candidates x 2 agents of at most 32 tokens (current comparator, both sides in one pass), trains 2 epochs
#: on up to 24 pairs per agent with LoRA r=8, and evaluates 16 items x 2 responses.
SMOLLM2_CONFIG: dict[str, object] = {
    **QUICKSTART_CONFIG,
    "num_iterations": 3,
    "preference_num_candidates": 4,
    "preference_pairs_per_sample": 2,
    "num_train_epochs": 2,
    # Two pairs per scoring forward: the gradient of eight up to float rounding (micro-batches are summed by size),
    # while the activations kept for the backward shrink: LoRA's peak RSS 5.2 -> 2.8 GiB (benchmarks/real_model.py).
    "scoring_batch_size": 2,
    "agent_learning_rate": 3.0e-4,
    "max_new_tokens": 32,
    "temperature": 0.7,
    "top_p": 0.9,
    "eval_num_samples": SMOLLM2_EVAL_ITEMS,
    "eval_samples_per_item": 2,
    "lora_r": 8,
    "lora_alpha": 16.0,
    "lora_target_modules": "all-linear",
    "use_chat_template": "auto",
}


def smollm2_spec(task: str = "length_ratio") -> ExperimentSpec:
    """MADPOIter on SmolLM2-135M-Instruct with LoRA on both agents and its chat template, a built-in task."""
    return _preset("smollm2", SMOLLM2_MODEL_NAME, task, SMOLLM2_TRAIN_ITEMS, SMOLLM2_CONFIG)


#: The MARLHF quickstart's config overrides (MARLHFIterConfig fields): a fresh reward model fitted on every round's
#: replay sample for four epochs, then one epoch of magrpo with four generations per item.
MARLHF_QUICKSTART_CONFIG: dict[str, object] = {
    "num_iterations": 4,
    "rl_algorithm": "magrpo",
    "num_generations": 4,
    "preference_num_candidates": 8,
    "preference_pairs_per_sample": 8,
    "pair_selection": "reward_gap",
    "preference_replay_mode": "all_history",
    "preference_replay_sample_size": 800,
    "max_new_tokens": 16,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": None,
    "agent_learning_rate": 5.0e-4,
    "reward_learning_rate": 1.0e-3,
    "reward_num_train_epochs": 4,
    "reward_train_batch_size": 8,
    "bt_validation_fraction": 0.25,
    "num_train_epochs": 1,
    "rollout_buffer_size": 4,
    "train_batch_size": 4,
    "eval_num_samples": QUICKSTART_EVAL_ITEMS,
    "eval_samples_per_item": 4,
    "agent_devices": "cpu",
    "seed": 0,
}
#: Training items of the MARLHF quickstart (examples/marlhf_quickstart.yaml; its evaluation items as above).
MARLHF_QUICKSTART_TRAIN_ITEMS = 64


def preset_config(algorithm: str) -> dict[str, object]:
    """The quickstart overrides for ``algorithm``'s config (the iterative preset's fields that the non-iterative
    config also has), or none."""
    from comlrl_lab.trainers.preference.algorithms import algorithm as algorithm_row

    row = algorithm_row(algorithm)
    base = QUICKSTART_CONFIG if row.family == "MADPO" else MARLHF_QUICKSTART_CONFIG
    names = {f.name for f in fields(row.config_class)}
    return {name: value for name, value in base.items() if name in names}
