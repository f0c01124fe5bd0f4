"""An experiment as data: algorithm, agents, task and config overrides; and the trainer built from it.

The same spec drives the workbench, the CLI (``comlrl-lab run spec.yaml``) and notebooks, and it is saved as
``spec.json`` in the run directory so a past run can be reopened. It never holds an API key, a literal header
value or a URL credential (``credentials.py``): only names of the environment variables that have them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from comlrl_lab.data.credentials import public_config
from comlrl_lab.data.tasks import get_task
from comlrl_lab.data.user_tasks import load_user_task
from comlrl_lab.engine import spec_checks
from comlrl_lab.models.tiny_model import TINY_MODEL_NAME
from comlrl_lab.trainers import preference
from comlrl_lab.trainers.preference.algorithms import ALGORITHM_TABLE, algorithm
from comlrl_lab.trainers.preference.config import SECRET_FIELDS


class _AlgorithmClasses(Mapping):
    """Algorithm name -> (config class, trainer class), from the algorithm table.

    The trainer class is looked up on access, so importing the engine does not import torch.
    """

    def __getitem__(self, name: str) -> tuple[type, type]:
        row = ALGORITHM_TABLE[name]
        return row.config_class, getattr(preference, row.trainer_class_name)

    def __iter__(self) -> Iterator[str]:
        return iter(ALGORITHM_TABLE)

    def __len__(self) -> int:
        return len(ALGORITHM_TABLE)


ALGORITHMS: Mapping[str, tuple[type, type]] = _AlgorithmClasses()


@dataclass
class ExperimentSpec:
    """What to run. ``config`` holds config-field overrides by CoMLRL name."""

    algorithm: str = "MADPOIter"
    agent_models: list[str] = field(default_factory=lambda: [TINY_MODEL_NAME, TINY_MODEL_NAME])
    task: str | None = "length_ratio"
    user_task: str | None = None  # path to a Python module (or "package.module") defining the task
    user_train_data: str | None = None
    user_eval_data: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    model_config: dict[str, Any] = field(default_factory=dict)
    # CoMLRL's wandb_config (project, entity, name, tags, ...): W&B logging, unless config["report_to"] says otherwise.
    wandb_config: dict[str, Any] | None = None
    name: str | None = None
    # Keep only the first N task items (None = all): quick looks in the workbench and small tests.
    max_train_items: int | None = None
    max_eval_items: int | None = None
    # Labels to find runs by (the Compare page filters on them); a sweep tags each of its cells with its id.
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        algorithm(self.algorithm)
        if not isinstance(self.tags, list) or not all(isinstance(t, str) and t for t in self.tags):
            raise ValueError(f"tags must be a list of non-empty strings, got {self.tags!r}.")
        if not self.agent_models:
            raise ValueError("agent_models must name at least one model.")
        for name in ("max_train_items", "max_eval_items"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1 or null, got {value!r}.")

    @property
    def config_class(self) -> type:
        return algorithm(self.algorithm).config_class

    def build_config(self) -> Any:
        values = dict(self.config)
        values.setdefault("num_agents", len(self.agent_models))
        unknown = spec_checks.unknown_config_fields(self.config_class, values)
        if unknown:
            raise ValueError(f"config: {unknown}")
        return self.config_class(**values)

    def num_rounds(self) -> int:
        """Rounds the run makes: ``num_iterations`` for the iterative trainers, one for the others."""
        return int(self.build_config().num_iterations) if algorithm(self.algorithm).iterative else 1

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["config"] = {k: v for k, v in public_config(self.config).items() if k not in SECRET_FIELDS}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExperimentSpec:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown experiment spec keys: {', '.join(unknown)}")
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path) -> ExperimentSpec:
        """Read and validate a spec file; every mistake is a ``SpecError`` naming the file, line and field."""
        path = Path(path)
        data, text = spec_checks.read_spec_file(path)
        try:
            config_class = algorithm(data.get("algorithm", cls.algorithm)).config_class
        except ValueError as error:
            raise spec_checks.locate(path, text, error, ["algorithm"]) from None
        data = spec_checks.check_spec_data(path, text, data, cls.__dataclass_fields__, config_class)
        try:
            spec = cls.from_dict(data)
            spec.build_config()
        except (ValueError, TypeError) as error:
            names = [*cls.__dataclass_fields__, *(data.get("config") or {})]
            raise spec_checks.locate(path, text, error, names) from None
        return spec

    def save(self, path: str | Path) -> None:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2, ensure_ascii=False), encoding="utf-8")


def resolve_task(spec: ExperimentSpec):
    if spec.user_task:
        return load_user_task(spec.user_task, data=spec.user_train_data, eval_data=spec.user_eval_data)
    if not spec.task:
        raise ValueError("choose a built-in task or a user task module")
    return get_task(spec.task)


def build_trainer(spec: ExperimentSpec, *, output_dir: str | Path, run_id: str, sink=None, control=None):
    """Validate the config (CoMLRL's messages), load the task and models, and construct the trainer."""
    config = spec.build_config()
    config.output_dir = str(output_dir)
    spec_checks.inside_run_dir(config, output_dir)
    trainer_class = ALGORITHMS[spec.algorithm][1]
    task = resolve_task(spec)
    models = list(spec.agent_models)
    if len(models) == 1 and config.num_agents > 1:
        models = models * config.num_agents
    kwargs: dict[str, Any] = {}
    if len(set(models)) == 1:
        kwargs["agent_model"] = models[0]
        kwargs["num_agents"] = len(models)
    else:
        kwargs["agents"] = models
    train_items, eval_items = task.train_items(), task.eval_items()
    if spec.max_train_items is not None:
        train_items = train_items[: spec.max_train_items]
    if spec.max_eval_items is not None:
        eval_items = eval_items[: spec.max_eval_items]
    return trainer_class(
        train_dataset=train_items,
        eval_dataset=eval_items,
        reward_func=task.reward_func,
        reward_processor=getattr(task, "reward_processor", None),
        formatters=list(task.formatters),
        model_config=dict(spec.model_config),
        wandb_config=dict(spec.wandb_config) if spec.wandb_config is not None else None,
        args=config,
        sink=sink,
        control=control,
        run_id=run_id,
        **kwargs,
    )
