"""The topic-relay task: both agents mention the item's topic, and agent 2 adds words agent 1 did not use.

For one joint response, let m_i = 1 when agent i's answer contains the topic word (or its plural), C the set
of agent 2's distinct content words (not stopwords, not the topic) and N the words of C absent from agent 1's
answer. Then ``reward = (m1 + m2) / 2 * |N| / |C| * min(1, |N| / 3)``: both should name the topic, agent 2
should not repeat agent 1 (the share |N| / |C|) and should add at least three new words (a bare "The rain is
nice." adds one). No content word in agent 2's answer, or either answer empty, gives 0.0.
"""

from __future__ import annotations

from comlrl_lab.data.rewards import batched_reward, set_reward_range
from comlrl_lab.data.tasks.base import Task, agent_header, align_completions, items_for_batch
from comlrl_lab.data.tasks.lexicon import STOPWORDS, mentions, words


def format_agent1(item: dict) -> str:
    return f"{agent_header(1, 2, item)} Say something about {item['topic']}.\nAnswer:"


def format_agent2(item: dict) -> str:
    return (
        f"{agent_header(2, 2, item)} Say something new about {item['topic']}, in words agent 1 does not use.\nAnswer:"
    )


#: New content words agent 2 must add for full credit.
NEW_WORDS_FOR_FULL_CREDIT = 3


def novelty(text1: str, text2: str, topic: str) -> float:
    """``|N| / |C| * min(1, |N| / 3)``: agent 2's new words, as a share of its content words and as a count."""
    topic_forms = {topic, topic + "s", topic + "es"}
    content2 = {w for w in words(text2) if w not in STOPWORDS and w not in topic_forms}
    if not content2:
        return 0.0
    new = content2 - set(words(text1))
    return len(new) / len(content2) * min(1.0, len(new) / NEW_WORDS_FOR_FULL_CREDIT)


def topic_relay_score(text1: str, text2: str, topic: str) -> float:
    """The joint reward of one pair of answers about ``topic``."""
    if not text1.strip() or not text2.strip():
        return 0.0
    mentioned = (mentions(text1, topic) + mentions(text2, topic)) / 2.0
    return mentioned * novelty(text1, text2, topic)


@batched_reward
def topic_relay_reward(completions_agent1, completions_agent2, *, prompts=None, batch_items=None) -> list[float]:
    """One joint reward per joint response; the topic comes from ``batch_items`` (or the prompt text)."""
    first, second = align_completions(completions_agent1, completions_agent2)
    items = items_for_batch(len(first), batch_items, prompts, ("topic",))
    return [topic_relay_score(a, b, item["topic"]) for a, b, item in zip(first, second, items)]


set_reward_range(topic_relay_reward, 0.0, 1.0)

TASK = Task(
    name="topic_relay",
    title="Topic relay",
    description=(
        "Both agents should mention the item's topic word, and agent 2 should say something new: "
        "reward = (share of agents that name the topic) x (share of agent 2's content words that agent 1 "
        "did not use) x min(1, new words / 3)."
    ),
    num_agents=2,
    formatters=(format_agent1, format_agent2),
    reward_func=topic_relay_reward,
    reward_range=(0.0, 1.0),
)
