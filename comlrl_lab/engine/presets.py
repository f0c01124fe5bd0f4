"""Ready-made experiments: the quickstart preset (the embedded model) and the real-model preset (SmolLM2-135M).

CoMLRL's defaults (learning rate 5e-6, 80 candidates, 256 tokens) are sized for real models on GPUs; on the 1M-
parameter embedded model and two CPU cores they run for a long time and learn nothing visible. The quickstart
preset is sized for that case and uses the opt-in MADPO stabilisers. The real-model preset runs the same loss on
SmolLM2-135M-Instruct (``comlrl-lab models add smollm2-135m-instruct``) with LoRA adapters on both agents and
its chat template, sized so that a round takes at most about three minutes on two CPU cores.
``benchmarks/learning.py --settings combined`` (``--model smollm2-135m-instruct`` for the second) measures them
over seeds; ``examples/quickstart.yaml`` and ``examples/smollm2.yaml`` are the same specs as files (a test keeps
them equal). It only describes runs; it does not start them.
"""

from __future__ import annotations

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
