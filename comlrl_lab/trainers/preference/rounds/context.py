"""What a collector and a learner work with: the agents, the task, the streams and progress, handed over explicitly.

A trainer builds one ``PartContext`` once its agents are loaded and gives it to its collector and its learner. They
read it, and never their trainer: what is fixed for the run comes in the context, what moves from phase to phase
comes with each call (the round in the ``PhaseRecords``, the step, i.e. the updates so far, as an argument), and
what a train phase changes in the trainer's counters goes back as its return value (``Trained``). The sampling,
seeding and task-reward helpers that the parts and the trainer's own evaluation share live here, so that nothing
needs the trainer itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comlrl_lab.data.records import JointCandidate, PreferencePair
from comlrl_lab.models.generation import SamplingSettings
from comlrl_lab.seeding import RandomStreams
from comlrl_lab.trainers.preference.comparators.base import encode_text
from comlrl_lab.trainers.preference.comparators.centralized import split_completion
from comlrl_lab.trainers.preference.rounds.collection import (
    agent_prompts,
    sample_joint_candidates,
    score_with_task_reward,
)
from comlrl_lab.trainers.preference.runtime.devices import DeviceLayout
from comlrl_lab.trainers.preference.runtime.distributed import DistContext
from comlrl_lab.trainers.preference.runtime.sink import PhaseControl

GENERATION_STREAM = "generation"


@dataclass(frozen=True)
class Trained:
    """What one train phase did to the trainer's counters; the trainer adds it up."""

    updates: int = 0  # optimiser steps taken; the metrics' step advances by as many
    env_steps: int = 0  # environment steps (``use_environment_step``, MARLHF rollouts)
    weights_changed: bool = False  # the next checkpoint writes the agents' weights again


@dataclass(frozen=True)
class CentralizedRoles:
    """Centralized collaboration: one actor writes every role's output in one tagged joint completion."""

    adapter: Any  # a validated CentralizedComparatorAdapter: builds the joint prompt, parses the joint text
    formatters: list[Callable[[dict], str]]  # one prompt formatter per role

    @property
    def count(self) -> int:
        return len(self.formatters)

    def prompt(self, item: dict) -> str:
        """The actor's one prompt for ``item``: every role's prompt, joined by the adapter."""
        return self.adapter.build_prompt(item, [fmt(item) for fmt in self.formatters])

    def view(self, candidate: JointCandidate, item: dict) -> JointCandidate:
        """A centralized candidate as the roles see it: one parsed completion and one role prompt per role."""
        texts = split_completion(self.adapter, candidate.completions[0], item, self.count)
        return JointCandidate(
            item_index=candidate.item_index,
            candidate_index=candidate.candidate_index,
            side=candidate.side,
            prompts=[fmt(item) for fmt in self.formatters],
            completions=texts if texts is not None else [""] * self.count,
            completion_ids=[],
            prompt_ids=[],
            parse_status=candidate.parse_status,
        )


@dataclass
class PartContext:
    """The trainer's agents, task and machinery as its collector and learner see them; built once per trainer.

    The lists are the trainer's own (``trainer.agents is context.agents``): training the agents here trains the
    trainer's. ``control`` may be replaced while the trainer lives (the engine attaches its own), and ``run_id``
    when a checkpoint is loaded; the trainer's attributes of those names are this context's.
    """

    config: Any
    algorithm_name: str  # for messages: "MADPO", "MARLHFIter", ...
    agents: list[Any]
    tokenizers: list[Any]
    optimizers: list[Any]
    formatters: list[Callable[[dict], str]]  # one per agent: item -> prompt
    devices: DeviceLayout
    model_config: dict
    agent_sources: list[Any]  # what each agent was loaded from (a name or path, or the model object given)
    train_items: list[dict]
    reward_func: Callable[..., Any]
    reward_processor: Callable[[float], float] | None
    roles: CentralizedRoles | None  # None unless collaboration_mode="centralized"
    streams: RandomStreams
    dist: DistContext
    control: PhaseControl
    output_dir: Path
    run_id: str

    @property
    def num_agents(self) -> int:
        return len(self.agents)

    @property
    def agent_devices(self) -> list[Any]:
        return self.devices.agents

    @property
    def centralized(self) -> bool:
        return self.roles is not None

    @property
    def train_mode_for_updates(self) -> bool:
        """The mode agents score in while learning: train mode only when dropout is wanted or checkpointing needs it."""
        return (not self.config.disable_dropout) or bool(self.config.gradient_checkpointing)

    def check_cancel(self) -> None:
        """Raise ``PhaseCancelled`` when a stop was asked for: sampling calls it at every step, so a stop lands
        within a step. Reads the control attached now (the engine's, once it attaches one)."""
        self.control.check_cancel()

    def sampling_settings(self, **overrides: Any) -> SamplingSettings:
        config = self.config
        values = dict(
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            batch_size=config.generation_batch_size,
            interrupt=self.check_cancel,
        )
        values.update(overrides)
        return SamplingSettings(**values)

    def pad_token_id(self, agent: int) -> int:
        tokenizer = self.tokenizers[agent]
        return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def row_seeds(
        self, purpose: str, item_indices: Sequence[int], agent: int, round_index: int | None
    ) -> list[int] | None:
        """One sampling seed per item for ``purpose`` in round ``round_index``, or None when sampling is stream-based.

        Seeds are named after (purpose, round, item, agent), never after a batch or a rank, so the tokens a row
        gets are the same whatever the batching, the sharding across ranks, or a resume in between. With
        ``round_index=None`` the round is left out of the name: every round draws the same numbers (evaluation's
        common random numbers).
        """
        # Differs from CoMLRL: one global, unseeded stream there; per-row seeds here (batch_invariant_sampling).
        if not self.config.batch_invariant_sampling:
            return None
        scope = purpose if round_index is None else f"{purpose}/{round_index}"
        return [self.streams.stream_seed(f"sample/{scope}/{int(k)}/{agent}") for k in item_indices]

    # Collection helpers ----------------------------------------------------------------------------------------
    def sample_current(
        self, items: Sequence[dict], item_indices: Sequence[int], num_candidates: int, round_index: int
    ) -> list[list[JointCandidate]]:
        """The current agents' ``num_candidates`` joint responses per item of round ``round_index``; progress
        advances by the items as each agent finishes."""
        generators = [self.streams.torch(GENERATION_STREAM, device) for device in self.agent_devices]
        return sample_joint_candidates(
            self.agents,
            self.tokenizers,
            agent_prompts(self.formatters, items),
            item_indices,
            num_candidates,
            self.sampling_settings(),
            generators,
            side="current",
            on_agent_done=lambda agent, tokens: self.control.advance(len(items), tokens),
            row_seeds=[self.row_seeds("current", item_indices, i, round_index) for i in range(self.num_agents)],
            devices=self.agent_devices,
            concurrent_cpu=self.config.concurrent_cpu_agents,
        )

    def gather_rows(self, rows: list[list[Any]]) -> list[list[Any]]:
        """Every rank's per-item rows (for its ``dist.shard`` of the items), on every rank, in item order."""
        return self.dist.gather_shards(rows)

    def score_task(self, candidates: list[JointCandidate], items_by_index: dict[int, dict]) -> None:
        """Fill the candidates' rewards in place with the task reward (``reward_func`` + ``reward_processor``)."""
        if self.roles is None:
            score_with_task_reward(candidates, items_by_index, self.reward_func, self.reward_processor)
            return
        # The user's reward sees one completion per role, parsed from the joint text; an untagged joint text
        # gives every role "" (CoMLRL's centralized-collaboration behaviour), so it scores, usually low.
        views = [self.roles.view(c, items_by_index[c.item_index]) for c in candidates]
        score_with_task_reward(views, items_by_index, self.reward_func, self.reward_processor)
        for candidate, view in zip(candidates, views):
            candidate.raw_reward, candidate.reward, candidate.details = view.raw_reward, view.reward, view.details

    def ensure_token_ids(self, pair: PreferencePair) -> PreferencePair:
        """Pairs imported from text get token ids from each agent's tokenizer (sampled pairs already have them)."""
        if pair.has_token_ids:
            return pair
        agents = range(self.num_agents)
        pair.prompt_ids = [list(self.tokenizers[i](pair.prompts[i])["input_ids"]) for i in agents]
        pair.winner_ids = [encode_text(self.tokenizers[i], pair.winner_completions[i]) for i in agents]
        pair.loser_ids = [encode_text(self.tokenizers[i], pair.loser_completions[i]) for i in agents]
        return pair
