"""Joint candidates for a collection phase: batched sampling per agent, then one oracle call per side.

Sampling runs all items x candidates of a phase for one agent in batches (``models.generation``), then
index-aligns them into joint responses. Agents on distinct CUDA devices sample concurrently, one thread each
(``map_agents``): generate waits on its device at every step, so one thread per device keeps all of them busy; CPU
agents do so too with ``concurrent_cpu_agents``, torch's threads split between them. The oracle is the task reward (``reward_func`` + ``reward_processor``)
or any callable that maps joint candidates to scores (the MARLHF reward model). It does not build pairs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from comlrl_lab.data.records import PARSE_OK, JointCandidate, Side, align_joint
from comlrl_lab.data.rewards import apply_reward_processor, call_reward_with_details
from comlrl_lab.models.generation import SamplingSettings, sample_candidates, sample_sides
from comlrl_lab.trainers.preference.runtime.concurrency import map_agents

T = TypeVar("T")

#: (candidates of one side, flattened) -> one score per candidate, for a learned oracle.
ScoreFn = Callable[[list[JointCandidate]], list[float]]


def agent_prompts(formatters: Sequence[Callable[[dict], str]], items: Sequence[dict]) -> list[list[str]]:
    """``prompts[i][k]`` = agent i's prompt for item k."""
    return [[fmt(item) for item in items] for fmt in formatters]


def sample_joint_candidates(
    models: Sequence[Any],
    tokenizers: Sequence[Any],
    prompts: list[list[str]],
    item_indices: Sequence[int],
    num_candidates: int,
    settings: SamplingSettings,
    generators: Sequence[Any],
    side: Side,
    on_agent_done: Callable[[int, int], None] | None = None,
    *,
    row_seeds: Sequence[Sequence[int] | None] | None = None,
    devices: Sequence[Any] | None = None,
    concurrent_cpu: bool = False,
) -> list[list[JointCandidate]]:
    """Sample ``num_candidates`` per agent per item; candidate j of every agent forms joint response j.

    Returns ``joint[k][j]`` for item k (position in ``item_indices``) and candidate j. ``row_seeds[i]`` (one
    seed per item, or None) switches agent i to batch-invariant sampling; ``devices`` (the agents' devices)
    lets agents on distinct GPUs sample concurrently, and agents on the CPU too with ``concurrent_cpu``.
    """

    def sample(agent: int):
        seeds = None if row_seeds is None else row_seeds[agent]
        samples = sample_candidates(
            models[agent],
            tokenizers[agent],
            prompts[agent],
            num_candidates,
            settings,
            generators[agent],
            row_seeds=seeds,
        )
        if on_agent_done is not None:
            on_agent_done(agent, sum(len(s.completion_ids) for row in samples for s in row))
        return samples

    # CPU agents share one generator per stream: only row-seeded sampling, which never draws from it, may overlap.
    row_seeded = row_seeds is not None and all(seeds is not None for seeds in row_seeds)
    per_agent = map_agents(
        sample,
        devices if devices is not None else ["cpu"] * len(models),
        concurrent_cpu=concurrent_cpu and row_seeded,
    )
    return align_joint(per_agent, prompts, item_indices, side)


def sample_joint_sides(
    models: Sequence[Any],
    tokenizers: Sequence[Any],
    prompts: list[list[str]],
    item_indices: Sequence[int],
    sides: Sequence[tuple[Side, int, Sequence[Sequence[int]]]],
    settings: SamplingSettings,
    on_agent_done: Callable[[int, list[int]], None] | None = None,
    *,
    devices: Sequence[Any] | None = None,
) -> list[list[list[JointCandidate]]]:
    """Row-seeded sides of one set of models in one pass per agent; result[s] as ``sample_joint_candidates``.

    ``sides[s]`` = (side name, candidates per item, ``row_seeds[i]`` per agent i). Each side gets the tokens that
    ``sample_joint_candidates`` with its count and seeds gives it; ``on_agent_done(agent, tokens per side)``.
    """

    def sample(agent: int):
        samples = sample_sides(
            models[agent],
            tokenizers[agent],
            prompts[agent],
            [count for _, count, _ in sides],
            settings,
            [seeds[agent] for _, _, seeds in sides],
        )
        if on_agent_done is not None:
            on_agent_done(agent, [sum(len(s.completion_ids) for row in side for s in row) for side in samples])
        return samples

    per_agent = map_agents(sample, devices if devices is not None else ["cpu"] * len(models))
    return [
        align_joint([per_agent[i][s] for i in range(len(models))], prompts, item_indices, side)
        for s, (side, _, _) in enumerate(sides)
    ]


def score_with_task_reward(
    candidates: list[JointCandidate],
    items: dict[int, dict],
    reward_func: Callable[..., Any],
    reward_processor: Callable[[float], float] | None,
) -> None:
    """Fill ``raw_reward``, ``reward`` and (when the reward explains itself) ``details`` in place, with one batched
    call over all parsed candidates; a reward with ``reward_details`` is asked for both at once."""
    scored = [c for c in candidates if c.parse_status == PARSE_OK]
    if not scored:
        return
    num_agents = len(scored[0].completions)
    completions = [[c.completions[i] for c in scored] for i in range(num_agents)]
    prompts = [[c.prompts[i] for c in scored] for i in range(num_agents)]
    batch_items = [items[c.item_index] for c in scored]
    raw, details = call_reward_with_details(reward_func, completions, prompts=prompts, batch_items=batch_items)
    processed = apply_reward_processor(reward_processor, raw)
    for j, (candidate, r, p) in enumerate(zip(scored, raw, processed)):
        candidate.raw_reward = float(r)
        candidate.reward = float(p)
        candidate.details = None if details is None else details[j]


def score_with(candidates: list[JointCandidate], score_fn: ScoreFn) -> None:
    """Learned oracle: raw = processed = the model score (no reward_processor, as in CoMLRL)."""
    scored = [c for c in candidates if c.parse_status == PARSE_OK]
    if not scored:
        return
    for candidate, value in zip(scored, score_fn(scored)):
        candidate.raw_reward = candidate.reward = float(value)


def _scored_rewards(candidates: Sequence[JointCandidate]) -> list[float]:
    return [c.reward for c in candidates if c.parse_status == PARSE_OK and not math.isnan(c.reward)]


def mean_reward(candidates: Sequence[JointCandidate]) -> float:
    values = _scored_rewards(candidates)
    return sum(values) / len(values) if values else math.nan


def reward_summary(candidates: Sequence[JointCandidate], *, stratified: bool = False) -> tuple[float, float, int]:
    """(mean, standard error of the mean, n) of the scored candidates' rewards; NaN where n is too small.

    The mean is over every scored sample. By default the samples are taken as independent draws, so the standard
    error counts both the spread between items and the sampling of responses. With ``stratified`` (several
    samples per item) the items are held fixed and only the sampling counts: with m_i scored samples of item i,
    of sample variance s_i^2, and N = sum m_i, SE^2 = sum m_i s_i^2 / N^2. An item with a single scored sample
    gets the pooled within-item variance. NaN when no item has two scored samples.
    """
    values = _scored_rewards(candidates)
    n = len(values)
    if n == 0:
        return math.nan, math.nan, 0
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan, n
    if not stratified:
        variance = sum((v - mean) ** 2 for v in values) / (n - 1)  # unbiased sample variance
        return mean, math.sqrt(variance / n), n
    by_item: dict[int, list[float]] = {}
    for candidate in candidates:
        if candidate.parse_status == PARSE_OK and not math.isnan(candidate.reward):
            by_item.setdefault(candidate.item_index, []).append(candidate.reward)
    total, squares, degrees, singles = 0.0, 0.0, 0, 0
    for rewards in by_item.values():
        m = len(rewards)
        if m == 1:
            singles += 1
            continue
        item_mean = sum(rewards) / m
        item_squares = sum((r - item_mean) ** 2 for r in rewards)
        total += m * item_squares / (m - 1)
        squares += item_squares
        degrees += m - 1
    if degrees == 0:
        return mean, math.nan, n
    total += singles * squares / degrees
    return mean, math.sqrt(total) / n, n
