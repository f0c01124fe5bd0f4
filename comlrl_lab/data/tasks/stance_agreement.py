"""The stance-agreement task: agent 1 gives an opinion, agent 2 a reason, both with the item's stance.

Each answer's polarity p_i is its VADER compound sentiment score in [-1, 1] (``lexicon.polarity``: a maintained
English lexicon with negation and degree rules, 0 with no sentiment word). With s = +1 for a "positive" item and -1
for a "negative" one, a_i = max(0, s * p_i) and ``agree`` = 1 when both polarities are outside VADER's neutral band
(|p| >= 0.05) with the same sign: ``reward = 0.4 * a_1 + 0.4 * a_2 + 0.2 * agree``. The agents are rewarded for
holding the asked stance, more for a stronger one, and a little for agreeing with each other.
"""

from __future__ import annotations

from comlrl_lab.data.rewards import batched_reward, set_reward_range
from comlrl_lab.data.tasks.base import Task, agent_header, align_completions, items_for_batch
from comlrl_lab.data.tasks.lexicon import NEUTRAL_BAND, polarity

STANCE_WEIGHT = 0.4
AGREEMENT_WEIGHT = 0.2


def format_agent1(item: dict) -> str:
    return f"{agent_header(1, 2, item)} Stance: {item['stance']}. Give a {item['stance']} opinion about {item['topic']}.\nAnswer:"


def format_agent2(item: dict) -> str:
    return f"{agent_header(2, 2, item)} Stance: {item['stance']}. Give a reason for a {item['stance']} view of {item['topic']}.\nAnswer:"


def stance_sign(stance: str) -> int:
    if stance not in ("positive", "negative"):
        raise ValueError(f"stance must be 'positive' or 'negative', got {stance!r}")
    return 1 if stance == "positive" else -1


def stance_agreement_score(text1: str, text2: str, stance: str) -> float:
    """The joint reward of one pair of answers for an item with ``stance``."""
    sign = stance_sign(stance)
    p1, p2 = polarity(text1), polarity(text2)
    agree = 1.0 if min(abs(p1), abs(p2)) >= NEUTRAL_BAND and p1 * p2 > 0 else 0.0
    return STANCE_WEIGHT * max(0.0, sign * p1) + STANCE_WEIGHT * max(0.0, sign * p2) + AGREEMENT_WEIGHT * agree


@batched_reward
def stance_agreement_reward(completions_agent1, completions_agent2, *, prompts=None, batch_items=None) -> list[float]:
    """One joint reward per joint response; the stance comes from ``batch_items`` (or the prompt text)."""
    first, second = align_completions(completions_agent1, completions_agent2)
    items = items_for_batch(len(first), batch_items, prompts, ("stance",))
    return [stance_agreement_score(a, b, item["stance"]) for a, b, item in zip(first, second, items)]


set_reward_range(stance_agreement_reward, 0.0, 1.0)

TASK = Task(
    name="stance_agreement",
    title="Stance agreement",
    description=(
        "Agent 1 gives an opinion and agent 2 a reason, both with the item's stance (positive or negative), "
        "judged by VADER's English sentiment score p in [-1, 1]: 0.4 x max(0, p toward the stance) per agent, "
        "0.2 when the two agree."
    ),
    num_agents=2,
    formatters=(format_agent1, format_agent2),
    reward_func=stance_agreement_reward,
    reward_range=(0.0, 1.0),
)
