"""One way to build a trainer in a test: ``build_trainer(kind, model_dir, out_dir, *settings, **overrides)``.

``kind`` is an algorithm name from the one table (``MADPO``, ``MADPOIter``, ``MARLHF``, ``MARLHFIter``). A trainer
starts from small settings that run in seconds on the random tiny model (``conftest.model_dir``): two agents on the
CPU, the six ``ITEMS`` (the first three for evaluation), ``length_ratio_reward``, one prompt formatter per agent,
three candidates of five tokens, one epoch and one round (``small_config``).

Every keyword overrides one of them: a config field by its name, anything else as the trainer's argument of that
name (``sink``, ``run_id``, ``control``, ``reward_func``, ``train_dataset``, ``formatters``, ``agent_model``,
``agents``, ``num_agents``, ...). ``None`` is the trainer's own ``None``: ``eval_dataset=None`` evaluates nothing,
``formatters=None`` prompts with ``item["prompt"]``. Dicts passed before the keywords apply first, in order: a
module's own settings, then a test's keywords on top.

Tests take the ``make_trainer`` fixture (``conftest.py``), which binds the model:
``make_trainer("MADPOIter", tmp_path, num_iterations=3, sink=sink)`` or
``make_trainer("MADPOIter", tmp_path, MODULE_SETTINGS, seed=2)``. The torchrun scripts (``dist_*_script.py``) call
``build_trainer`` directly, and spec-level tests (engine, sweeps) start their configs from ``small_config``.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from comlrl_lab.data.tasks.length_ratio import length_ratio_reward
from comlrl_lab.trainers import preference
from comlrl_lab.trainers.preference.algorithms import algorithm

ITEMS = [{"prompt": f"the {w} cat", "topic": w} for w in ("red", "blue", "green", "big", "small", "fast")]

#: What every kind starts from: small enough for seconds, random enough (temperature 1) to give pairs.
SMALL = dict(
    preference_num_candidates=3,
    max_new_tokens=5,
    temperature=1.0,
    top_p=1.0,
    top_k=None,
    agent_learning_rate=1e-3,
    num_train_epochs=1,
    eval_num_samples=2,
    agent_devices="cpu",
    seed=7,
)
ITERATIVE = dict(num_iterations=1)
MARLHF = dict(num_generations=2, reward_num_train_epochs=1)


def fmt_one(item: dict) -> str:
    return item["prompt"] + " one"


def fmt_two(item: dict) -> str:
    return item["prompt"] + " two"


def small_config(kind: str, **overrides: Any) -> dict[str, Any]:
    """The small settings of ``kind`` with ``overrides`` on top, as config field values."""
    row = algorithm(kind)
    values = dict(SMALL)
    if row.iterative:
        values.update(ITERATIVE)
    if row.family == "MARLHF":
        values.update(MARLHF)
    values.update(overrides)
    return values


def build_trainer(kind: str, model_dir: str, out_dir: str | Path, *settings: dict[str, Any], **overrides: Any):
    """A ``kind`` trainer of the small settings, writing under ``out_dir / "out"``; see the module docstring."""
    overrides = {name: value for layer in (*settings, overrides) for name, value in layer.items()}
    row = algorithm(kind)
    # num_agents is a config field too (the role count of centralized collaboration); here it is the trainer's.
    field_names = {f.name for f in fields(row.config_class)} - {"num_agents"}
    config = {name: value for name, value in overrides.items() if name in field_names}
    arguments = dict(
        agent_model=model_dir,
        num_agents=2,
        train_dataset=ITEMS,
        eval_dataset=ITEMS[:3],
        reward_func=length_ratio_reward,
        formatters=[fmt_one, fmt_two],
    )
    arguments.update({name: value for name, value in overrides.items() if name not in field_names})
    if "args" not in arguments:
        arguments["args"] = row.config_class(**small_config(kind, output_dir=str(Path(out_dir) / "out"), **config))
    elif config:
        raise TypeError(f"pass config fields either in args= or as keywords, not both: {sorted(config)}")
    trainer_class = getattr(preference, row.trainer_class_name)
    return trainer_class(**arguments)
