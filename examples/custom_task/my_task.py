"""Example user task: one agent describes a topic, the other says something kind about it.

Load it in Python with
``load_user_task("examples/custom_task/my_task.py", data="examples/custom_task/data.jsonl")``, or name
``examples/custom_task/my_task.py:reward_func`` in the workbench. The module follows the conventions of
``comlrl_lab.data.user_tasks``: ``formatters`` (one per agent), ``reward_func`` written for CoMLRL's calling
convention, and optional ``NUM_AGENTS``, ``TITLE``, ``DESCRIPTION`` and ``DATA_PATH``.
"""

from __future__ import annotations

import re

from comlrl_lab.data.rewards import set_reward_range

NUM_AGENTS = 2
TITLE = "Topic and praise (example user task)"
DESCRIPTION = "Agent 1 writes a sentence about the topic; agent 2 says something good about it; they should not repeat each other."
DATA_PATH = "data.jsonl"  # relative to this file

GOOD_WORDS = frozenset(
    {"good", "great", "happy", "lovely", "warm", "calm", "fun", "beautiful", "nice", "sweet", "kind"}
)
_WORD = re.compile(r"[a-z]+")


def describe_topic(item: dict) -> str:
    """Agent 1's prompt."""
    return f"Write one sentence about the {item['topic']} {item['setting']}."


def praise_topic(item: dict) -> str:
    """Agent 2's prompt."""
    return f"Say something good about the {item['topic']} in one sentence."


formatters = [describe_topic, praise_topic]


def reward_func(
    completions_agent1: list[str], completions_agent2: list[str], batch_items: list[dict] | None = None
) -> list[float]:
    """Joint reward in [0, 1], CoMLRL style: one-element lists in, ``[reward]`` out.

    0.4 when agent 1 names the topic, 0.4 when agent 2 uses a good word, 0.2 when both answered and
    the answers differ.
    """
    topic = str(batch_items[0].get("topic", "")).lower() if batch_items else ""
    first = _WORD.findall(completions_agent1[0].lower())
    second = _WORD.findall(completions_agent2[0].lower())
    reward = 0.0
    if topic and topic in first:
        reward += 0.4
    if GOOD_WORDS.intersection(second):
        reward += 0.4
    if first and second and first != second:
        reward += 0.2
    return [reward]


set_reward_range(reward_func, 0.0, 1.0)
