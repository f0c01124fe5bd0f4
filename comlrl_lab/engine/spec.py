"""An experiment as data: algorithm, agents, task and config overrides; how it is read; the trainer built from it.

The same spec drives the workbench, the CLI (``comlrl-lab run spec.yaml``) and notebooks, and it is saved as
``spec.json`` in the run directory so a past run can be reopened. It never holds an API key, a literal header
value or a URL credential (``credentials.py``): only names of the environment variables that have them.

``ExperimentSpec.read`` is the one reader of spec files, for the CLI and the Setup page alike: a syntax error, an
unknown key, field or built-in task (with the closest name), a value the field codec cannot read or the config
refuses, each is one ``SpecError`` line at the place in the file it is about. The config fields a spec sets keep
their own names everywhere, and the config built from it is what checks them.
"""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from comlrl_lab.data.tasks import get_task, list_tasks
from comlrl_lab.data.user_tasks import load_user_task
from comlrl_lab.engine.spec_file import SpecError, located, parse_spec_text
from comlrl_lab.models.tiny_model import TINY_MODEL_NAME
from comlrl_lab.names.phases import round_phases
from comlrl_lab.trainers import preference
from comlrl_lab.trainers.preference.algorithms import ALGORITHM_TABLE, algorithm
from comlrl_lab.trainers.preference.config import SECRET_FIELDS, ConfigError, check_field_names
from comlrl_lab.trainers.preference.config.credentials import public_config
from comlrl_lab.trainers.preference.config.fields import decode_strings


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
            raise ConfigError(f"tags must be a list of non-empty strings, got {self.tags!r}.", field="tags")
        if self.task is not None and self.task not in list_tasks():
            close = difflib.get_close_matches(str(self.task), list_tasks(), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"unknown task {self.task!r}; {hint}(built-in tasks: {', '.join(list_tasks())}; a task of your own "
                "goes in user_task)",
                field="task",
                value=self.task,
                suggestion=close[0] if close else None,
            )
        if not self.agent_models:
            raise ConfigError("agent_models must name at least one model.", field="agent_models")
        for name in ("max_train_items", "max_eval_items"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be an integer >= 1 or null, got {value!r}.", field=name, value=value)
        self._validated: tuple[str, Any] | None = None  # (the overrides it was built from, the config)

    @property
    def config_class(self) -> type:
        return algorithm(self.algorithm).config_class

    def validated_config(self) -> Any:
        """The spec's one validated config, built the first time it is asked for (``read`` asks at once) and again
        only if the spec's algorithm, agents or overrides change: unknown fields refused with the closest name, then
        the config's own checks. Read it; ``build_config`` gives a copy to change."""
        key = self._config_key()
        if self._validated is None or self._validated[0] != key:
            try:
                check_field_names(self.config_class, self.config)
            except ConfigError as error:
                raise ConfigError(f"config: {error}", field=error.field, suggestion=error.suggestion) from None
            self._validated = (key, self.config_class(**{"num_agents": len(self.agent_models), **self.config}))
        return self._validated[1]

    def _config_key(self) -> str:
        return json.dumps([self.algorithm, len(self.agent_models), self.config], sort_keys=True, default=repr)

    def build_config(self) -> Any:
        """A copy of the validated config, for a trainer to own (it sets ``output_dir``, say)."""
        return copy.deepcopy(self.validated_config())

    def num_rounds(self) -> int:
        """Rounds the run makes: ``num_iterations`` for the iterative trainers, one for the others."""
        return int(self.validated_config().num_iterations) if algorithm(self.algorithm).iterative else 1

    def round_phases(self) -> tuple[str, ...]:
        """The phases of one round: with a label phase when people or a judge label the comparisons."""
        return round_phases(self.validated_config().preference_source)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["config"] = {k: v for k, v in public_config(self.config).items() if k not in SECRET_FIELDS}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExperimentSpec:
        """A spec from a mapping (``to_dict`` output, a parsed file): unknown keys are refused with the closest
        name, and config values written as text (YAML reads ``1e-3`` as text) are read by the field codec."""
        keys = list(cls.__dataclass_fields__)
        for key in data:
            if key not in keys:
                close = difflib.get_close_matches(str(key), keys, n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(
                    f"unknown spec key {key!r}{hint}", field=str(key), suggestion=close[0] if close else None
                )
        values = dict(data)
        config = values.get("config")
        if config is not None and not isinstance(config, Mapping):
            raise ConfigError("config must be a mapping of config fields", field="config", value=config)
        if config:
            values["config"] = decode_strings(algorithm(values.get("algorithm", cls.algorithm)).config_class, config)
        return cls(**values)

    @staticmethod
    def holds_spec_keys(data: Mapping[str, Any]) -> bool:
        """Whether a parsed file is a spec (it has a spec key) rather than a bare config of CoMLRL field names."""
        return any(key in ExperimentSpec.__dataclass_fields__ for key in data)

    @classmethod
    def read(cls, text: str, source: str, *, bare_config_of: str | None = None) -> ExperimentSpec:
        """Read and validate spec text (YAML when ``source`` ends in .yaml/.yml, else JSON); every mistake is one
        ``SpecError`` naming ``source``, the line and the field. With ``bare_config_of``, a file of config fields
        alone (a CoMLRL config) is read as that algorithm's config."""
        data = parse_spec_text(text, source)
        if bare_config_of is not None and not cls.holds_spec_keys(data):
            data = {"algorithm": bare_config_of, "config": data}
        try:
            spec = cls.from_dict(data)
            spec.validated_config()
        except ConfigError as error:
            raise located(source, text, error, fallback_key="config") from None
        return spec

    @classmethod
    def load(cls, path: str | Path) -> ExperimentSpec:
        """``read`` the spec file at ``path``."""
        path = Path(path)
        if not path.is_file():
            what = "is a directory, not a spec file" if path.is_dir() else "no such spec file"
            raise SpecError(f"{path}: {what}")
        return cls.read(path.read_text(encoding="utf-8"), str(path))

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
    inside_run_dir(config, output_dir)
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


#: Config fields naming folders the trainer writes to; the engine keeps them inside the run directory.
RUN_DIR_FIELDS = ("preference_replay_dir", "policy_checkpoint_dir")


def inside_run_dir(config: Any, run_dir: str | Path | None = None) -> None:
    """Refuse a folder field that would write outside the run directory; with ``run_dir``, anchor it there.

    A relative path is taken inside the run directory; an absolute path or one that climbs out (``..``) is
    refused, so a spec from the app can write nowhere but its own run.
    """
    for name in RUN_DIR_FIELDS:
        value = getattr(config, name, None)
        if value is None:
            continue
        relative = Path(str(value))
        if relative.is_absolute() or ".." in relative.parts or str(value).startswith("~"):
            raise ConfigError(
                f"{name} must be a folder inside the run directory, given relative to it (such as "
                f"'replay_b'), got {str(value)!r}",
                field=name,
                value=value,
            )
        if run_dir is not None:
            setattr(config, name, str(Path(run_dir) / relative))
