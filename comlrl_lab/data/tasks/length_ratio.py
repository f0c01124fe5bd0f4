"""The classic length-ratio task: agent 2's answer should be about twice as long as agent 1's, in words.

Reward for one joint response with n1 and n2 whitespace words: ``max(0, 1 - |n2/n1 - 2| / 2)``, and 0.0 when
either answer is empty. So 3 and 6 words score 1.0, 3 and 3 score 0.5, 3 and 12 score 0.0.
"""

from __future__ import annotations

from comlrl_lab.data.rewards import batched_reward, set_reward_range
from comlrl_lab.data.tasks.base import Task, agent_header, align_completions
from comlrl_lab.data.tasks.lexicon import word_count

TARGET_RATIO = 2.0


def format_agent1(item: dict) -> str:
    return f"{agent_header(1, 2, item)} Write a short answer about {item['topic']}.\nAnswer:"


def format_agent2(item: dict) -> str:
    return f"{agent_header(2, 2, item)} Write an answer about {item['topic']}, twice as long as agent 1's.\nAnswer:"


def length_ratio_score(text1: str, text2: str) -> float:
    """The joint reward of one pair of answers."""
    n1, n2 = word_count(text1), word_count(text2)
    if n1 == 0 or n2 == 0:
        return 0.0
    return max(0.0, 1.0 - abs(n2 / n1 - TARGET_RATIO) / TARGET_RATIO)


@batched_reward
def length_ratio_reward(completions_agent1, completions_agent2, *, prompts=None, batch_items=None) -> list[float]:
    """One joint reward per joint response; ``prompts`` and ``batch_items`` are accepted and not needed."""
    first, second = align_completions(completions_agent1, completions_agent2)
    return [length_ratio_score(a, b) for a, b in zip(first, second)]


set_reward_range(length_ratio_reward, 0.0, 1.0)

TASK = Task(
    name="length_ratio",
    title="Length ratio (2x)",
    description=(
        "Both agents write about the item's topic; agent 2's answer should be about twice as long as "
        "agent 1's, counted in words. Reward max(0, 1 - |n2/n1 - 2| / 2), 0 if either answer is empty."
    ),
    num_agents=2,
    formatters=(format_agent1, format_agent2),
    reward_func=length_ratio_reward,
    reward_range=(0.0, 1.0),
)
