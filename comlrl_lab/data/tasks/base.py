"""The ``Task`` record and the plumbing every built-in task shares: item files, reward arguments, prompts.

A task bundles per-agent formatters, a joint reward and its item files. This module loads the items (JSONL
package data, read once and cached) and lines up a reward call's arguments; it knows nothing about any
particular task's scoring.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

DATA_PACKAGE = "comlrl_lab.data.tasks"
SPLITS = ("train", "eval")


@dataclass(frozen=True)
class Task:
    """A cooperative task: what each agent is asked (``formatters[i](item)``) and how a joint answer scores.

    ``reward_func`` follows CoMLRL's convention ``reward(completions_agent1, completions_agent2, *,
    prompts=None, batch_items=None) -> list[float]`` and is marked ``supports_batch``: element j of the
    result is the joint reward of joint response j.
    """

    name: str
    title: str
    description: str
    num_agents: int
    formatters: tuple[Callable[[dict], str], ...]
    reward_func: Callable[..., list[float]]
    reward_range: tuple[float, float] = (0.0, 1.0)

    def train_items(self) -> list[dict]:
        """The training items (fresh dicts each call, so callers may change them freely)."""
        return [dict(item) for item in load_items_file(self.name, "train")]

    def eval_items(self) -> list[dict]:
        """The evaluation items (fresh dicts each call)."""
        return [dict(item) for item in load_items_file(self.name, "eval")]

    def prompts(self, item: dict) -> list[str]:
        """Every agent's prompt for ``item``, in agent order."""
        return [fmt(item) for fmt in self.formatters]

    def reward_details(self, *completions: Any, **kwargs: Any) -> list[Any] | None:
        """One breakdown per joint response from ``reward_func.reward_details`` (called like the reward), or None
        when the reward explains nothing beyond its number."""
        details = getattr(self.reward_func, "reward_details", None)
        return None if details is None else details(*completions, **kwargs)


@cache
def load_items_file(task_name: str, split: str) -> tuple[dict, ...]:
    """Read ``data/<task>_<split>.jsonl`` from the installed package once; a tuple so the cache stays intact."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    path = resources.files(DATA_PACKAGE) / "data" / f"{task_name}_{split}.jsonl"
    items = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        item = json.loads(line)
        if not isinstance(item, dict) or "prompt" not in item:
            raise ValueError(f"{path}: line {line_no} is not an item object with a 'prompt' key")
        items.append(item)
    return tuple(items)


def as_text_list(completions: Any) -> list[str]:
    """One agent's completions as a list of strings; a bare string counts as one completion."""
    if isinstance(completions, str):
        return [completions]
    return ["" if c is None else str(c) for c in completions]


def align_completions(completions_agent1: Any, completions_agent2: Any) -> tuple[list[str], list[str]]:
    """Both agents' completion lists, checked to pair up one-to-one into joint responses."""
    first, second = as_text_list(completions_agent1), as_text_list(completions_agent2)
    if len(first) != len(second):
        raise ValueError(
            f"each joint response needs one completion per agent: got {len(first)} and {len(second)} completions"
        )
    return first, second


_FIELD_IN_PROMPT = {"topic": re.compile(r"Topic: ([a-z]+)"), "stance": re.compile(r"Stance: ([a-z]+)")}


def items_for_batch(
    count: int, batch_items: Sequence[dict] | None, prompts: Sequence[Any] | None, fields: Sequence[str]
) -> list[dict]:
    """One item per joint response, holding at least ``fields``.

    CoMLRL passes ``batch_items=[item]`` for a single joint response; a batched caller may pass one item for
    all ``count`` responses or one per response. Without items, the fields are read back from the
    built-in prompt text ("Topic: rain", "Stance: positive"), so a reward can also score bare prompts.
    """
    if batch_items is not None:
        batch_items = list(batch_items)
        if len(batch_items) == 1:
            batch_items = batch_items * count
        if len(batch_items) != count:
            raise ValueError(f"batch_items must hold 1 or {count} items, got {len(batch_items)}")
        if all(all(f in item for f in fields) for item in batch_items):
            return batch_items
        prompts = prompts if prompts is not None else [item.get("prompt", "") for item in batch_items]
    if prompts is None:
        raise ValueError(f"this reward needs the task item fields {list(fields)}: pass batch_items or prompts")
    texts = [_first_text(p) for p in prompts]
    if len(texts) == 1:
        texts = texts * count
    if len(texts) != count:
        raise ValueError(f"prompts must hold 1 or {count} entries, got {len(texts)}")
    recovered = []
    for text in texts:
        item = {}
        for f in fields:
            match = _FIELD_IN_PROMPT[f].search(text)
            if match is None:
                raise ValueError(f"cannot find the task field '{f}' in prompt {text!r}; pass batch_items")
            item[f] = match.group(1)
        recovered.append(item)
    return recovered


def _first_text(prompt: Any) -> str:
    # CoMLRL passes one prompt string per joint response; a per-agent list shares the same item fields.
    while isinstance(prompt, (list, tuple)):
        if not prompt:
            return ""
        prompt = prompt[0]
    return "" if prompt is None else str(prompt)


def agent_header(agent_index: int, num_agents: int, item: dict) -> str:
    """The opening every built-in prompt shares: which agent is speaking and what the item is about."""
    return f"Agent {agent_index} of {num_agents}. Topic: {item['topic']} {item['setting']}."
