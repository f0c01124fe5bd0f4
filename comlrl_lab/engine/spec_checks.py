"""Spec-file mistakes found before any work, each as one line naming the file, the line and the field.

``read_spec_file`` parses a YAML or JSON spec and reports syntax errors at their line in the file (not at
``<unicode string>``). ``check_spec_data`` refuses unknown spec keys and unknown config fields with a close-match
suggestion, and turns numbers that YAML 1.1 reads as strings (``1e-3``) into numbers for numeric config fields.
``locate`` adds the line of the field a validation message names. ``preflight`` loads the task (its module and
data files), checks that model paths exist and resolves every device field, so a mistake costs no run directory.
This module does not build trainers or load model weights.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_INTEGER = re.compile(r"^[+-]?\d+$")


class SpecError(ValueError):
    """A mistake in an experiment spec: ``file:line: what, and what was meant``."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices``, else ``""``."""
    close = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def key_line(text: str, key: str) -> int | None:
    """The 1-based line where ``key`` is first written as a mapping key (YAML or JSON), or None."""
    pattern = re.compile(rf"""(^|[{{,\s])["']?{re.escape(key)}["']?\s*:""", re.MULTILINE)
    found = pattern.search(text)
    return None if found is None else text.count("\n", 0, found.start() + len(found.group(1))) + 1


def _at(path: Path, line: int | None) -> str:
    return f"{path}:{line}" if line else str(path)


def read_spec_file(path: str | Path) -> tuple[dict[str, Any], str]:
    """The spec mapping and the file's text; ``SpecError`` for a missing file or a syntax error, located."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not a spec file" if path.is_dir() else "no such spec file"
        raise SpecError(f"{path}: {what}")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.MarkedYAMLError as error:
            mark = error.problem_mark or error.context_mark
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
            raise SpecError(f"{where}: YAML syntax error: {error.problem or error.context}") from None
        except yaml.YAMLError as error:
            raise SpecError(f"{path}: YAML error: {error}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise SpecError(f"{path}:{error.lineno}:{error.colno}: JSON syntax error: {error.msg}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: an experiment spec must be a mapping of keys, got {type(data).__name__}")
    return data, text


def check_spec_data(
    path: Path, text: str, data: Mapping[str, Any], spec_keys: Iterable[str], config_class: type | None
) -> dict[str, Any]:
    """Refuse unknown keys, located and with a suggestion; return ``data`` with numeric strings coerced."""
    spec_keys = list(spec_keys)
    for key in data:
        if key not in spec_keys:
            raise SpecError(f"{_at(path, key_line(text, key))}: unknown spec key {key!r}{did_you_mean(key, spec_keys)}")
    config = data.get("config")
    if config is None or config_class is None:
        return dict(data)
    if not isinstance(config, dict):
        raise SpecError(f"{_at(path, key_line(text, 'config'))}: config must be a mapping of config fields")
    types = {f.name: str(f.type) for f in fields(config_class)}
    coerced = {}
    for name, value in config.items():
        if name not in types:
            raise SpecError(
                f"{_at(path, key_line(text, name))}: config: {config_class.__name__} has no field {name!r}"
                f"{did_you_mean(name, types)}"
            )
        coerced[name] = coerce_number(value, types[name])
    return {**data, "config": coerced}


def coerce_number(value: Any, annotation: str) -> Any:
    """``value`` as a number when it is a numeric string and the field is numeric (YAML reads ``1e-3`` as text)."""
    if not isinstance(value, str) or not _NUMBER.match(value.strip()):
        return value
    if "float" in annotation:
        return float(value)
    if "int" in annotation and _INTEGER.match(value.strip()):
        return int(value)
    return value


def unknown_config_fields(config_class: type, values: Mapping[str, Any]) -> str | None:
    """A message naming the first unknown field of ``values`` with a suggestion, or None when all are known."""
    known = [f.name for f in fields(config_class)]
    for name in values:
        if name not in known:
            return f"{config_class.__name__} has no field {name!r}{did_you_mean(name, known)}"
    return None


def locate(path: Path, text: str, error: Exception, names: Iterable[str]) -> SpecError:
    """``error`` as a ``SpecError`` at the line of the longest of ``names`` its message mentions."""
    message = str(error)
    for name in sorted(names, key=len, reverse=True):
        if re.search(rf"\b{re.escape(name)}\b", message):
            return SpecError(f"{_at(path, key_line(text, name))}: {message}")
    return SpecError(f"{path}: {message}")


def preflight(spec: Any) -> None:
    """Check what the spec names on this machine: the task with its module and data files, model paths, devices."""
    from comlrl_lab.engine.spec import resolve_task
    from comlrl_lab.models.loading import ModelLoadError, resolve_model_source
    from comlrl_lab.trainers.preference.devices import resolve_layout

    config = spec.build_config()
    inside_run_dir(config)
    resolve_task(spec)
    for model in spec.agent_models:
        if not isinstance(model, str):
            continue
        try:
            source = resolve_model_source(model)
        except ModelLoadError as exc:  # a registry name that is not registered here
            raise ValueError(f"agent_models: {exc}") from None
        if source.startswith((".", "~", "/")) and not Path(source).exists():
            raise ValueError(f"agent_models: {model!r} is not a folder or .gguf file on this machine (no such path)")
    count = 1 if getattr(config, "collaboration_mode", "") == "centralized" else int(config.num_agents)
    resolve_layout(config, count, model_config=spec.model_config)


def memory_warning(spec: Any) -> str | None:
    """A one-line warning when the spec's agents will not fit in the memory available now (``footprint``); None when
    they fit, or when a model's config cannot be read (the run's own loading then says why)."""
    from comlrl_lab.models.footprint import describe_model, memory_check

    config = spec.build_config()
    models = list(spec.agent_models)
    if len(models) == 1:
        models = models * int(config.num_agents)
    lora = config.lora_r is not None
    dtype = spec.model_config.get("dtype", spec.model_config.get("torch_dtype"))
    try:
        footprints = {
            m: describe_model(m, dtype=dtype, lora_r=config.lora_r or 8, lora_target_modules=config.lora_target_modules)
            for m in set(models)
        }
    except (OSError, ValueError):  # a config that cannot be read now: loading the model reports why, in the run
        return None
    return memory_check([footprints[m] for m in models], lora=lora)


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
            raise ValueError(
                f"{name} must be a folder inside the run directory, given relative to it (such as "
                f"'replay_b'), got {str(value)!r}"
            )
        if run_dir is not None:
            setattr(config, name, str(Path(run_dir) / relative))
