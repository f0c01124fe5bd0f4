"""A small finished run for the workbench tests: MADPOIter, history comparator, lambda_decay, two rounds, with
reward distributions logged.

Plain functions (like ``model_fixtures``), used by the AppTest and browser test modules. The run drives the
engine directly with tiny settings: 8 training items, 4 candidates, 12 new tokens, 4 eval items, so it takes
seconds. The agents are the embedded tiny model when it has been built, else a random tiny Llama.
"""

from __future__ import annotations

from pathlib import Path

from model_fixtures import build_tiny_model_dir, embedded_tiny_model_dir

from comlrl_lab.engine import ExperimentSpec, RunManager
from comlrl_lab.models.tiny_model import TINY_MODEL_NAME

ROOT = Path(__file__).resolve().parents[1]
#: The example user task (module and JSONL data) that engine-level tests run on.
USER_TASK = str(ROOT / "examples" / "custom_task" / "my_task.py")
USER_DATA = str(ROOT / "examples" / "custom_task" / "data.jsonl")

SEED_TASK = "length_ratio"
SEED_CONFIG = {
    "num_iterations": 2,
    "preference_num_candidates": 4,
    "max_new_tokens": 12,
    "comparator_policy": "history",
    "preference_replay_mode": "lambda_decay",
    "preference_replay_lambda": 0.5,
    "train_batch_size": 4,
    "eval_num_samples": 4,
    "log_reward_distribution": True,
}


def agent_model(tmp_dir: Path) -> str:
    """The embedded tiny model's name when it is built, else the path of a random tiny Llama saved in ``tmp_dir``."""
    if embedded_tiny_model_dir() is not None:
        return TINY_MODEL_NAME
    return str(build_tiny_model_dir(Path(tmp_dir) / "random-tiny"))


def seed_spec(model: str, **config) -> ExperimentSpec:
    return ExperimentSpec(
        algorithm="MADPOIter",
        agent_models=[model, model],
        task=SEED_TASK,
        config={**SEED_CONFIG, **config},
        name="seeded",
        max_train_items=8,
        max_eval_items=4,
    )


def user_task_spec(**config) -> ExperimentSpec:
    """A one-round MADPOIter spec on the example user task, with the default agent models (never loaded by tests
    that only create, validate or list runs)."""
    return ExperimentSpec(
        algorithm="MADPOIter",
        task=None,
        user_task=USER_TASK,
        user_train_data=USER_DATA,
        user_eval_data=USER_DATA,
        config={"num_iterations": 1, **config},
    )


def custom_task_spec(model: str, config: dict, **spec_fields) -> ExperimentSpec:
    """A MADPOIter spec for two agents on ``model``, trained and evaluated on the example user task."""
    return ExperimentSpec(
        algorithm="MADPOIter",
        agent_models=[model, model],
        task=None,
        user_task=USER_TASK,
        user_train_data=USER_DATA,
        user_eval_data=USER_DATA,
        config=config,
        **spec_fields,
    )


def seed_run(runs_root: Path, model: str) -> str:
    """Create and finish the two-round run under ``runs_root``; return its run id. The stores are closed after."""
    manager = RunManager(runs_root)
    try:
        run_id = manager.create(seed_spec(model))
        manager.start(run_id, rounds=2)
        progress = manager.wait(run_id, timeout=600)
        if progress.status != "finished":
            raise RuntimeError(
                f"seeding the workbench run failed: {progress.status} {progress.last_error}\n{progress.last_traceback}"
            )
        return run_id
    finally:
        manager.close()


def fresh_app_caches() -> None:
    """Close the app's open stores and clear Streamlit's caches, which AppTest instances in one process share."""
    import streamlit as st

    from comlrl_lab.ui import services

    services.close_all()
    st.cache_resource.clear()
    st.cache_data.clear()
