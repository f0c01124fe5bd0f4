"""The built-in cooperative tasks, looked up by name, and ``load_object`` for user task code.

Each task lives in its own module (``length_ratio``, ``topic_relay``, ``stance_agreement``) and ships its
items as JSONL package data written by ``python -m comlrl_lab.data.tasks.generate``. Nothing here imports
torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from comlrl_lab.data.tasks import length_ratio, stance_agreement, topic_relay
from comlrl_lab.data.tasks.base import Task

_TASKS: dict[str, Task] = {t.name: t for t in (length_ratio.TASK, topic_relay.TASK, stance_agreement.TASK)}


def list_tasks() -> list[str]:
    """Names of the built-in tasks, in the order the workbench shows them."""
    return list(_TASKS)


def get_task(name: str) -> Task:
    """The built-in task called ``name``; ``ValueError`` listing the available names otherwise."""
    try:
        return _TASKS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown task {name!r}; available tasks: {', '.join(_TASKS)}") from None


def load_object(spec: str) -> Any:
    """The object named by ``"package.module:attribute"`` (dots after the colon walk attributes).

    This is how a user's own reward function or formatter is named in a config file or the workbench.
    """
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ValueError(f"expected 'module:attribute', got {spec!r}")
    module_name, attr_path = spec.split(":")
    if not module_name or not attr_path:
        raise ValueError(f"expected 'module:attribute', got {spec!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} for {spec!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{spec!r}: {module_name!r} has no attribute {attr_path!r}") from None
    return obj


__all__ = ["Task", "get_task", "list_tasks", "load_object"]
