"""Ready-made experiments: the quickstart preset, the Setup page's starting point for the embedded model.

CoMLRL's defaults (learning rate 5e-6, 80 candidates, 256 tokens) are sized for real models on GPUs; on the 1M-
parameter embedded model and two CPU cores they run for a long time and learn nothing visible. The quickstart
preset is sized for that case and uses the opt-in MADPO stabilisers. ``benchmarks/learning.py --settings
combined`` measures it over seeds; ``examples/quickstart.yaml`` is the same spec as a file (a test keeps the
two equal). It only describes runs; it does not start them.
"""

from __future__ import annotations

from comlrl_lab.engine.spec import ExperimentSpec
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


def quickstart_spec(task: str = "length_ratio") -> ExperimentSpec:
    """MADPOIter on the embedded model and a built-in task, sized to learn visibly in about two CPU minutes."""
    return ExperimentSpec(
        algorithm="MADPOIter",
        name="quickstart",
        agent_models=[TINY_MODEL_NAME, TINY_MODEL_NAME],
        task=task,
        max_train_items=QUICKSTART_TRAIN_ITEMS,
        max_eval_items=QUICKSTART_EVAL_ITEMS,
        config=dict(QUICKSTART_CONFIG),
    )
