"""Collectors: the collect and select phases of a round, shared by both algorithms.

A collector makes the round's candidates and pairs, then chooses what the learner trains on:

* ``CurrentCollector`` (MADPO, MARLHF): the current agents only, pairs within each item's candidates, and the
  select phase passes the round's pairs on unchanged.
* ``ComparatorCollector`` (MADPOIter, MARLHFIter): the current agents against a comparator (current,
  current_copy, model, history, api), pairs across the two sides, every round's pairs kept in the replay buffer,
  and the select phase draws the replay sample B^(ν). It also writes the policy snapshots the history
  comparator reads.

A collector works through its host trainer (``PreferenceTrainerBase``): the agents, the random streams, the
task oracle and the progress control. It never trains, and it knows nothing of the learner, except for an
optional ``model_scorer`` through which MARLHFIter lets its fitted reward model label the next comparisons.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from comlrl_lab.data import metric_names as M
from comlrl_lab.data.records import JointCandidate, PreferencePair
from comlrl_lab.data.reward_distribution import (
    DISTRIBUTION_DIR,
    MISSING_RANGE_MESSAGE,
    declared_reward_range,
    distribution_payload,
    distribution_rows,
    write_distribution_file,
)
from comlrl_lab.models.chat import raw_formatter
from comlrl_lab.trainers.preference.collection import (
    ScoreFn,
    agent_prompts,
    mean_reward,
    sample_joint_sides,
    score_with,
)
from comlrl_lab.trainers.preference.comparators import ComparatorContext, build_comparator
from comlrl_lab.trainers.preference.comparators.centralized import (
    TaggedCentralizedComparatorAdapter,
    validate_adapter,
)
from comlrl_lab.trainers.preference.comparators.local import INITIAL_SNAPSHOT, snapshot_name
from comlrl_lab.trainers.preference.devices import model_dtype_spec
from comlrl_lab.trainers.preference.pairing import base_pairs, iterative_pairs
from comlrl_lab.trainers.preference.replay import ReplayBuffer
from comlrl_lab.trainers.preference.sink import PhaseRecords

if TYPE_CHECKING:
    from comlrl_lab.trainers.preference.base import PreferenceTrainerBase

PAIRS_STREAM = "pairs"
REPLAY_STREAM = "replay"


class CurrentCollector:
    """Candidates from the current agents only; the round's pairs are its training set."""

    def __init__(self, host: PreferenceTrainerBase):
        self.host = host
        self.round_pairs: list[PreferencePair] = []
        self.train_pairs: list[PreferencePair] = []
        self.total_pairs = 0

    # collect ------------------------------------------------------------------------------------------
    def collect(self, records: PhaseRecords) -> None:
        host = self.host
        items = _require_items(host)
        # Each rank samples and scores its shard of the items; the gathered rows are the same on every rank.
        indices = host.dist.shard(list(range(len(items))))
        local_items = [items[k] for k in indices]
        host.control.begin(host.round_index, "collect", len(local_items) * host.num_agents)
        local = host.collect_current(local_items, indices, host.args.preference_num_candidates)
        host.score_task([c for row in local for c in row], dict(zip(indices, local_items)))
        joint = host.gather_rows(local)
        flat = [c for row in joint for c in row]
        rng = host.streams.python(PAIRS_STREAM)
        pairs: list[PreferencePair] = []
        for row in joint:
            pairs.extend(
                base_pairs(row, selection=host.args.pair_selection, cap=host.args.preference_pairs_per_sample, rng=rng)
            )
        for pair in pairs:
            pair.round_index = host.round_index
        self.round_pairs = pairs
        self.total_pairs += len(pairs)
        records.candidates = flat
        records.pairs = pairs
        reward = mean_reward(flat)
        records.add_metrics(
            host.updates_seen,
            {
                M.REWARD_MEAN: reward,
                M.EXPECTED_RETURN: reward,
                M.COLLECTED_PAIRS: len(pairs),
                M.COLLECT_TOKENS_PER_SECOND: _tokens_per_second(host.control),
            },
        )

    # select -------------------------------------------------------------------------------------------
    def select(self, records: PhaseRecords) -> None:
        host = self.host
        host.control.begin(host.round_index, "select", 1)
        self.train_pairs = list(self.round_pairs)
        if not self.train_pairs:
            host.log(records, f"{host.algorithm_name}: no non-tied preference pairs were generated.", "warning")
        records.add_metrics(host.updates_seen, {M.TRAIN_PREFERENCE_PAIRS: len(self.train_pairs)})

    # round hooks and state ----------------------------------------------------------------------------
    def after_train(self) -> None:
        """Hook run after the learner's train phase."""

    def end_of_round(self) -> None:
        self.round_pairs, self.train_pairs = [], []

    def state_dict(self) -> dict[str, Any]:
        return {"round_pairs": self.round_pairs, "train_pairs": self.train_pairs, "total_pairs": self.total_pairs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round_pairs = list(state["round_pairs"])
        self.train_pairs = list(state["train_pairs"])
        self.total_pairs = int(state["total_pairs"])


class ComparatorCollector(CurrentCollector):
    """The current agents against a comparator, with every round's pairs in the replay buffer.

    ``model_scorer`` returns a learned oracle for the new comparisons, or None for the task reward; it is asked
    at every collect phase (MARLHFIter: the reward model fitted in the previous round, when configured).
    """

    def __init__(
        self,
        host: PreferenceTrainerBase,
        centralized_comparator_adapter: Any = None,
        model_scorer: Callable[[], ScoreFn | None] | None = None,
    ):
        super().__init__(host)
        self.model_scorer = model_scorer
        args = host.args
        self.reward_range: tuple[float, float] | None = None
        if args.log_reward_distribution:
            self.reward_range = declared_reward_range(host.reward_func)
            if self.reward_range is None:
                raise ValueError(MISSING_RANGE_MESSAGE)
        # This round's raw candidate rewards per side ("target" = current agents), kept for the select phase's file.
        self.round_rewards: dict[str, list[float]] = {"target": [], "comparator": []}
        self.adapter = validate_adapter(centralized_comparator_adapter or TaggedCentralizedComparatorAdapter())
        self.comparator_devices = list(host.devices.comparator)
        # One root for the snapshots the collector writes and the history comparator reads.
        root = args.policy_checkpoint_dir
        self.history_dir = Path(root) if root else host.output_dir / "policy_history"
        self.comparator = build_comparator(
            ComparatorContext(
                config=args,
                models=host.agents,
                tokenizers=host.tokenizers,
                agent_devices=host.agent_devices,
                comparator_devices=self.comparator_devices,
                streams=host.streams,
                sampling=host.sampling_settings(),
                history_dir=self.history_dir,
                adapter=self.adapter,
                model_config=host.model_config,
                dtype=model_dtype_spec(host.model_config),
                row_seeds=host.row_seeds if args.batch_invariant_sampling else None,
                request_formatters=[raw_formatter(f) for f in host.formatters],
            )
        )
        self.replay = ReplayBuffer(
            mode=args.preference_replay_mode,
            k=args.preference_replay_k,
            lam=args.preference_replay_lambda,
            sample_size=args.preference_replay_sample_size,
            replay_dir=args.preference_replay_dir or str(host.output_dir / "preference_replay"),
            num_agents=host.num_agents,
            run_id=host.run_id,
            write_files=host.dist.is_main,
        )

    @property
    def saves_policy_history(self) -> bool:
        return self.host.args.comparator_policy == "history" or self.host.args.policy_checkpoint_dir is not None

    # collect ------------------------------------------------------------------------------------------
    def collect(self, records: PhaseRecords) -> None:
        host = self.host
        args = host.args
        items = _require_items(host)
        if host.round_index == 1 and self.saves_policy_history:
            self.save_policy_snapshot(INITIAL_SNAPSHOT)
        # Each rank samples and scores its shard of the items (both sides); the rows are then gathered in item
        # order, so pairing below draws the same numbers on every rank and for any number of ranks.
        indices = host.dist.shard(list(range(len(items))))
        local_items = [items[k] for k in indices]
        n = int(args.preference_num_candidates)
        m = int(args.comparator_num_candidates or n)
        host.control.begin(host.round_index, "collect", 2 * len(local_items) * host.num_agents)
        if self.sides_in_one_pass():
            current, comparator = self.sample_both_sides(local_items, indices, n, m)
        else:
            current = host.collect_current(local_items, indices, n)
            self.comparator.prepare_round(host.round_index)
            try:
                prompts = [[fmt(item) for item in local_items] for fmt in host.formatters]
                comparator = self.comparator.generate(local_items, indices, prompts, m)
            finally:
                self.comparator.release()
        host.control.advance(len(local_items) * host.num_agents)
        self.score_candidates(
            [c for row in current for c in row], [c for row in comparator for c in row], dict(zip(indices, local_items))
        )
        rows = host.gather_rows(list(zip(current, comparator)))
        current, comparator = [row[0] for row in rows], [row[1] for row in rows]
        current_flat = [c for row in current for c in row]
        comparator_flat = [c for row in comparator for c in row]
        rng = host.streams.python(PAIRS_STREAM)
        pairs: list[PreferencePair] = []
        for current_row, comparator_row in zip(current, comparator):
            pairs.extend(
                iterative_pairs(
                    current_row,
                    comparator_row,
                    selection=args.pair_selection,
                    cap=args.preference_pairs_per_sample,
                    rng=rng,
                    round_index=host.round_index,
                )
            )
        self.round_pairs = pairs
        self.total_pairs += len(pairs)
        self.replay.add_round(host.round_index, pairs)
        records.candidates = current_flat + comparator_flat
        records.pairs = pairs
        self.round_rewards = {
            "target": [c.raw_reward for c in current_flat],
            "comparator": [c.raw_reward for c in comparator_flat if c.parsed],
        }
        unparsed = sum(1 for c in comparator_flat if not c.parsed)
        if unparsed:
            host.log(
                records,
                f"round {host.round_index}: {unparsed} comparator outputs could not be parsed and were skipped",
                "warning",
            )
        reward = mean_reward(current_flat)
        records.add_metrics(
            host.updates_seen,
            {
                M.REWARD_MEAN: reward,
                M.EXPECTED_RETURN: reward,
                M.COMPARATOR_REWARD_MEAN: mean_reward(comparator_flat),
                M.UNPARSED_COMPARATOR_CANDIDATES: unparsed,
                M.CURRENT_WIN_SHARE: _share(pairs, "current"),
                M.CURRENT_ITERATION: host.round_index,
                M.CURRENT_PREFERENCE_PAIRS: len(pairs),
                M.TOTAL_PREFERENCE_PAIRS: self.total_pairs,
                M.COLLECT_TOKENS_PER_SECOND: _tokens_per_second(host.control),
            },
        )

    def sides_in_one_pass(self) -> bool:
        """Whether the comparator samples the live agents with per-row seeds and the agents' own settings, so
        that one pass over each agent can sample both sides (``SamplingSettings.sides_in_one_pass``)."""
        settings = self.host.sampling_settings()
        return (
            settings.sides_in_one_pass
            and bool(self.host.args.batch_invariant_sampling)
            and self.comparator.samples_live_agents()
            and self.comparator.context.sampling == settings
        )

    def sample_both_sides(
        self, items: list[dict], indices: list[int], n: int, m: int
    ) -> tuple[list[list[JointCandidate]], list[list[JointCandidate]]]:
        """Current and comparator candidates from one ``sample_sides`` pass per agent: each side is row-seeded as
        in two passes, so it gets the same tokens; each prompt is prefilled once for both sides."""
        host = self.host
        host._require_aligned()
        agents = range(host.num_agents)
        sides = [
            ("current", n, [host.row_seeds("current", indices, i) for i in agents]),
            ("comparator", m, [self.comparator.row_seeds("comparator", indices, i) for i in agents]),
        ]
        current, comparator = sample_joint_sides(
            host.agents,
            host.tokenizers,
            agent_prompts(host.formatters, items),
            indices,
            sides,
            host.sampling_settings(),
            on_agent_done=lambda agent, tokens: host.control.advance(len(items), tokens[0]),
            devices=host.agent_devices,
        )
        return current, comparator

    def score_candidates(
        self, current: list[JointCandidate], comparator: list[JointCandidate], items_by_index: dict[int, dict]
    ) -> None:
        """Both sides scored by one oracle: the learned one when ``model_scorer`` offers it, else the task reward."""
        scorer = self.model_scorer() if self.model_scorer is not None else None
        if scorer is not None:
            score_with(current + comparator, scorer)
        else:
            self.host.score_task(current + comparator, items_by_index)

    # select -------------------------------------------------------------------------------------------
    def select(self, records: PhaseRecords) -> None:
        host = self.host
        host.control.begin(host.round_index, "select", 1)
        selection = self.replay.select(host.round_index, host.streams.python(REPLAY_STREAM))
        self.train_pairs = list(selection.pairs)
        mode = host.args.preference_replay_mode
        records.replay_rows = [
            {
                "source_round": int(source),
                "mode": mode,
                "weight": float(weight),
                "drawn_count": int(selection.drawn.get(source, 0)),
            }
            for source, weight in sorted(selection.weights.items())
        ]
        if not self.train_pairs:
            host.log(
                records,
                f"{host.algorithm_name}: no replay preference pairs were available for iteration {host.round_index} "
                f"(current generated {len(self.round_pairs)}).",
                "warning",
            )
        records.add_metrics(host.updates_seen, {M.TRAIN_PREFERENCE_PAIRS: len(self.train_pairs)})
        if self.reward_range is not None:
            self.record_reward_distribution(records)

    def record_reward_distribution(self, records: PhaseRecords) -> None:
        """CoMLRL's reward_distributions/iteration_NNNN.json (under the run's output_dir) and its store rows."""
        host = self.host
        selected = {
            "target": [p.target_raw_reward for p in self.train_pairs if p.target_raw_reward is not None],
            "comparator": [p.comparator_raw_reward for p in self.train_pairs if p.comparator_raw_reward is not None],
        }
        payload = distribution_payload(host.round_index, self.reward_range, self.round_rewards, selected)
        if payload is None:
            return
        if host.dist.is_main:
            # Differs from CoMLRL: the files go under the run's output_dir, not the W&B dir or the working directory.
            write_distribution_file(host.output_dir / DISTRIBUTION_DIR, payload)
        records.reward_distributions = distribution_rows(payload)
        for template, series, extra in (
            (M.REWARD_DISTRIBUTION, payload["candidate"], {}),
            (M.SELECTED_REWARD_DISTRIBUTION, payload["selected"], {"pair_count": len(self.train_pairs)}),
        ):
            values = {"current_iteration": host.round_index, **extra}
            for side in ("target", "comparator"):
                values[f"{side}_sample_count"] = series[side]["sample_count"]
                if series[side]["mean"] is not None:  # CoMLRL logs no mean for an empty side
                    values[f"{side}_mean"] = series[side]["mean"]
            records.add_metrics(host.updates_seen, {M.name(template, key=k): v for k, v in values.items()})

    # round hooks and state ----------------------------------------------------------------------------
    def after_train(self) -> None:
        if self.saves_policy_history:
            self.save_policy_snapshot(snapshot_name(self.host.round_index))

    def save_policy_snapshot(self, name: str) -> None:
        """The agents (LoRA: their adapters) under ``<history root>/<name>``; written by the main rank, read by all."""
        host = self.host
        target = self.history_dir / name
        if host.dist.is_main:
            for i, (model, tokenizer) in enumerate(zip(host.agents, host.tokenizers)):
                model.save_pretrained(target / f"agent_{i}")
                tokenizer.save_pretrained(target / f"agent_{i}")
        host.dist.barrier()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "replay": self.replay.state_dict(), "round_rewards": self.round_rewards}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.replay.load_state_dict(state["replay"])
        # Checkpoints written before reward distributions were logged have no round rewards.
        self.round_rewards = state.get("round_rewards", {"target": [], "comparator": []})


def _require_items(host: PreferenceTrainerBase) -> list[dict]:
    if not host.train_items:
        raise ValueError(f"{host.algorithm_name} needs a train_dataset with at least one item.")
    return host.train_items


def _share(pairs: list[PreferencePair], side: str) -> float:
    return sum(1 for p in pairs if p.winner_side == side) / len(pairs) if pairs else math.nan


def _tokens_per_second(control) -> float:
    return control.tokens / max(1e-9, time.monotonic() - control.started_at)
