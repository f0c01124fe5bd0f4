"""The built-in cooperative tasks, looked up by name; ``load_object`` (from ``user_tasks``) names user task code.

Each task lives in its own module (``length_ratio``, ``topic_relay``, ``stance_agreement``) and ships its
items as JSONL package data written by ``python -m comlrl_lab.data.tasks.generate``. Nothing here imports
torch.
"""

from __future__ import annotations

from comlrl_lab.data.tasks import length_ratio, stance_agreement, topic_relay
from comlrl_lab.data.tasks.base import Task
from comlrl_lab.data.user_tasks import load_object

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


__all__ = ["Task", "get_task", "list_tasks", "load_object"]
