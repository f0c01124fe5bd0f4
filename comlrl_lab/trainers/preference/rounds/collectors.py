"""Collectors: the collect and select phases of a round, shared by both algorithms.

A collector makes the round's candidates and pairs, then chooses what the learner trains on:

* ``CurrentCollector`` (MADPO, MARLHF): the current agents only, pairs within each item's candidates, and the
  select phase passes the round's pairs on unchanged.
* ``ComparatorCollector`` (MADPOIter, MARLHFIter): the current agents against a comparator (current,
  current_copy, model, history, api), pairs across the two sides, every round's pairs kept in the replay buffer,
  and the select phase draws the replay sample B^(ν). It also writes the policy snapshots the history
  comparator reads.

A collector works with what its trainer hands it in a ``PartContext``: the agents, the random streams, the
task oracle and the progress control; the round comes with each phase's records and the step as an argument. It
never trains, never changes the trainer's counters, and knows nothing of the learner, except for an optional
``model_scorer`` through which MARLHFIter lets its fitted reward model label the next comparisons.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from comlrl_lab.data.labels import Label, LabelledRound, labelled_pairs
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
from comlrl_lab.names import metric_names as M
from comlrl_lab.trainers.preference.comparators import ComparatorContext, build_comparator
from comlrl_lab.trainers.preference.comparators.centralized import (
    TaggedCentralizedComparatorAdapter,
    validate_adapter,
)
from comlrl_lab.trainers.preference.comparators.local import INITIAL_SNAPSHOT, snapshot_name
from comlrl_lab.trainers.preference.rounds.collection import (
    ScoreFn,
    agent_prompts,
    mean_reward,
    sample_joint_sides,
    score_with,
)
from comlrl_lab.trainers.preference.rounds.context import PartContext
from comlrl_lab.trainers.preference.rounds.labelling import blind
from comlrl_lab.trainers.preference.rounds.pairing import base_pairs, iterative_pairs
from comlrl_lab.trainers.preference.rounds.replay import ReplayBuffer
from comlrl_lab.trainers.preference.runtime.devices import model_dtype_spec
from comlrl_lab.trainers.preference.runtime.sink import PhaseRecords

PAIRS_STREAM = "pairs"
REPLAY_STREAM = "replay"


class CurrentCollector:
    """Candidates from the current agents only; the round's pairs are its training set."""

    def __init__(self, context: PartContext):
        self.context = context
        self.round_pairs: list[PreferencePair] = []
        self.train_pairs: list[PreferencePair] = []
        self.total_pairs = 0
        # preference_source human or judge: collect's pairs are comparisons, and their verdicts (the label phase's)
        # decide the pairs select makes.
        self.labelled = context.config.preference_source != "reward"
        self.round_labels: list[Label] = []
        self.labelled_pairs: list[PreferencePair] = []

    # collect ------------------------------------------------------------------------------------------
    def collect(self, records: PhaseRecords, step: int) -> None:
        context, config, round_index = self.context, self.context.config, records.round_index
        items = _require_items(context)
        # Each rank samples and scores its shard of the items; the gathered rows are the same on every rank.
        indices = context.dist.shard(list(range(len(items))))
        local_items = [items[k] for k in indices]
        context.control.begin(round_index, "collect", len(local_items) * context.num_agents)
        local = context.sample_current(local_items, indices, config.preference_num_candidates, round_index)
        context.score_task([c for row in local for c in row], dict(zip(indices, local_items)))
        joint = context.gather_rows(local)
        flat = [c for row in joint for c in row]
        rng = context.streams.python(PAIRS_STREAM)
        pairs: list[PreferencePair] = []
        for row in joint:
            pairs.extend(
                base_pairs(
                    row,
                    selection=config.pair_selection,
                    cap=config.preference_pairs_per_sample,
                    rng=rng,
                    keep_ties=self.labelled,
                )
            )
        for pair in pairs:
            pair.round_index = round_index
        if self.labelled:
            blind(context, pairs)
        self.round_pairs = pairs
        self.total_pairs += len(pairs)
        records.candidates = flat
        records.pairs = pairs
        reward = mean_reward(flat)
        records.add_metrics(
            step,
            {
                M.REWARD_MEAN: reward,
                M.EXPECTED_RETURN: reward,
                M.COLLECTED_PAIRS: len(pairs),
                M.COLLECT_TOKENS_PER_SECOND: _tokens_per_second(context.control),
            },
        )

    # select -------------------------------------------------------------------------------------------
    def select(self, records: PhaseRecords, step: int) -> None:
        context = self.context
        context.control.begin(records.round_index, "select", 1)
        self.train_pairs = self.labelled_round(records, step).pairs if self.labelled else list(self.round_pairs)
        if not self.train_pairs:
            records.add_event("warning", f"{context.algorithm_name}: no non-tied preference pairs were generated.")
        records.add_metrics(step, {M.TRAIN_PREFERENCE_PAIRS: len(self.train_pairs)})

    def labelled_round(self, records: PhaseRecords, step: int) -> LabelledRound:
        """The round's pairs from the label phase's verdicts, with their counts as metrics."""
        made = labelled_pairs(self.round_pairs, records.round_index, self.round_labels)
        self.labelled_pairs = made.pairs
        records.add_metrics(
            step,
            {M.LABELLED_PAIRS: made.kept, M.LABELLED_DROPPED: made.dropped, M.LABELLED_OVERRULED: made.overruled},
        )
        return made

    # round hooks and state ----------------------------------------------------------------------------
    def after_train(self, round_index: int) -> None:
        """Hook run after the learner's train phase of round ``round_index``."""

    def end_of_round(self) -> None:
        self.round_pairs, self.train_pairs, self.round_labels, self.labelled_pairs = [], [], [], []

    def state_dict(self) -> dict[str, Any]:
        labels = [[x.round, x.pair_index, x.labeller, x.verdict, x.a_side] for x in self.round_labels]
        return {
            "round_pairs": self.round_pairs,
            "train_pairs": self.train_pairs,
            "total_pairs": self.total_pairs,
            "round_labels": labels,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round_pairs = list(state["round_pairs"])
        self.train_pairs = list(state["train_pairs"])
        self.total_pairs = int(state["total_pairs"])
        # Checkpoints written before the label phase existed have no labels.
        self.round_labels = [Label(int(r), int(i), w, v, a) for r, i, w, v, a in state.get("round_labels", [])]


class ComparatorCollector(CurrentCollector):
    """The current agents against a comparator, with every round's pairs in the replay buffer.

    ``model_scorer`` returns a learned oracle for the new comparisons, or None for the task reward; it is asked
    at every collect phase (MARLHFIter: the reward model fitted in the previous round, when configured).
    """

    def __init__(
        self,
        context: PartContext,
        centralized_comparator_adapter: Any = None,
        model_scorer: Callable[[], ScoreFn | None] | None = None,
    ):
        super().__init__(context)
        self.model_scorer = model_scorer
        args = context.config
        self.reward_range: tuple[float, float] | None = None
        if args.log_reward_distribution:
            self.reward_range = declared_reward_range(context.reward_func)
            if self.reward_range is None:
                raise ValueError(MISSING_RANGE_MESSAGE)
        # This round's raw candidate rewards per side ("target" = current agents), kept for the select phase's file.
        self.round_rewards: dict[str, list[float]] = {"target": [], "comparator": []}
        # The round being collected: the comparator samples only then, and names its row seeds after it.
        self.collecting_round = 1
        self.adapter = validate_adapter(centralized_comparator_adapter or TaggedCentralizedComparatorAdapter())
        self.comparator_devices = list(context.devices.comparator)
        # One root for the snapshots the collector writes and the history comparator reads.
        root = args.policy_checkpoint_dir
        self.history_dir = Path(root) if root else context.output_dir / "policy_history"
        self.comparator = build_comparator(
            ComparatorContext(
                config=args,
                models=context.agents,
                tokenizers=context.tokenizers,
                agent_devices=context.agent_devices,
                comparator_devices=self.comparator_devices,
                streams=context.streams,
                sampling=context.sampling_settings(),
                history_dir=self.history_dir,
                adapter=self.adapter,
                model_config=context.model_config,
                dtype=model_dtype_spec(context.model_config),
                row_seeds=self.comparator_row_seeds if args.batch_invariant_sampling else None,
                request_formatters=[raw_formatter(f) for f in context.formatters],
            )
        )
        self.replay = ReplayBuffer(
            args,
            replay_dir=args.preference_replay_dir or str(context.output_dir / "preference_replay"),
            num_agents=context.num_agents,
            run_id=context.run_id,
            write_files=context.dist.is_main,
        )

    @property
    def saves_policy_history(self) -> bool:
        config = self.context.config
        return config.comparator_policy == "history" or config.policy_checkpoint_dir is not None

    def comparator_row_seeds(self, purpose: str, item_indices: list[int], agent: int) -> list[int] | None:
        """The comparator's per-row sampling seeds, named after the round being collected."""
        return self.context.row_seeds(purpose, item_indices, agent, self.collecting_round)

    # collect ------------------------------------------------------------------------------------------
    def collect(self, records: PhaseRecords, step: int) -> None:
        context, args, round_index = self.context, self.context.config, records.round_index
        items = _require_items(context)
        self.collecting_round = round_index
        if round_index == 1 and self.saves_policy_history:
            self.save_policy_snapshot(INITIAL_SNAPSHOT)
        # Each rank samples and scores its shard of the items (both sides); the rows are then gathered in item
        # order, so pairing below draws the same numbers on every rank and for any number of ranks.
        indices = context.dist.shard(list(range(len(items))))
        local_items = [items[k] for k in indices]
        n = int(args.preference_num_candidates)
        m = int(args.comparator_num_candidates or n)
        context.control.begin(round_index, "collect", 2 * len(local_items) * context.num_agents)
        if self.sides_in_one_pass():
            current, comparator = self.sample_both_sides(local_items, indices, n, m)
        else:
            current = context.sample_current(local_items, indices, n, round_index)
            self.comparator.prepare_round(round_index)
            try:
                prompts = [[fmt(item) for item in local_items] for fmt in context.formatters]
                comparator = self.comparator.generate(local_items, indices, prompts, m)
            finally:
                self.comparator.release()
        context.control.advance(len(local_items) * context.num_agents)
        self.score_candidates(
            [c for row in current for c in row], [c for row in comparator for c in row], dict(zip(indices, local_items))
        )
        rows = context.gather_rows(list(zip(current, comparator)))
        current, comparator = [row[0] for row in rows], [row[1] for row in rows]
        current_flat = [c for row in current for c in row]
        comparator_flat = [c for row in comparator for c in row]
        rng = context.streams.python(PAIRS_STREAM)
        pairs: list[PreferencePair] = []
        for current_row, comparator_row in zip(current, comparator):
            pairs.extend(
                iterative_pairs(
                    current_row,
                    comparator_row,
                    selection=args.pair_selection,
                    cap=args.preference_pairs_per_sample,
                    rng=rng,
                    round_index=round_index,
                    keep_ties=self.labelled,
                )
            )
        self.round_pairs = pairs
        self.total_pairs += len(pairs)
        if self.labelled:
            blind(context, pairs)  # the replay buffer gets the labelled pairs at select
        else:
            self.replay.add_round(round_index, pairs)
        records.candidates = current_flat + comparator_flat
        records.pairs = pairs
        self.round_rewards = {
            "target": [c.raw_reward for c in current_flat],
            "comparator": [c.raw_reward for c in comparator_flat if c.parsed],
        }
        unparsed = sum(1 for c in comparator_flat if not c.parsed)
        if unparsed:
            records.add_event(
                "warning", f"round {round_index}: {unparsed} comparator outputs could not be parsed and were skipped"
            )
        reward = mean_reward(current_flat)
        records.add_metrics(
            step,
            {
                M.REWARD_MEAN: reward,
                M.EXPECTED_RETURN: reward,
                M.COMPARATOR_REWARD_MEAN: mean_reward(comparator_flat),
                M.UNPARSED_COMPARATOR_CANDIDATES: unparsed,
                M.CURRENT_WIN_SHARE: _share(pairs, "current"),
                M.CURRENT_ITERATION: round_index,
                M.CURRENT_PREFERENCE_PAIRS: len(pairs),
                M.TOTAL_PREFERENCE_PAIRS: self.total_pairs,
                M.COLLECT_TOKENS_PER_SECOND: _tokens_per_second(context.control),
            },
        )

    def sides_in_one_pass(self) -> bool:
        """Whether the comparator samples the live agents with per-row seeds and the agents' own settings, so
        that one pass over each agent can sample both sides (``SamplingSettings.sides_in_one_pass``)."""
        settings = self.context.sampling_settings()
        return (
            settings.sides_in_one_pass
            and bool(self.context.config.batch_invariant_sampling)
            and self.comparator.samples_live_agents()
            and self.comparator.context.sampling == settings
        )

    def sample_both_sides(
        self, items: list[dict], indices: list[int], n: int, m: int
    ) -> tuple[list[list[JointCandidate]], list[list[JointCandidate]]]:
        """Current and comparator candidates from one ``sample_sides`` pass per agent: each side is row-seeded as
        in two passes, so it gets the same tokens; each prompt is prefilled once for both sides."""
        context, round_index = self.context, self.collecting_round
        agents = range(context.num_agents)
        sides = [
            ("current", n, [context.row_seeds("current", indices, i, round_index) for i in agents]),
            ("comparator", m, [self.comparator.row_seeds("comparator", indices, i) for i in agents]),
        ]
        current, comparator = sample_joint_sides(
            context.agents,
            context.tokenizers,
            agent_prompts(context.formatters, items),
            indices,
            sides,
            context.sampling_settings(),
            on_agent_done=lambda agent, tokens: context.control.advance(len(items), tokens[0]),
            devices=context.agent_devices,
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
            self.context.score_task(current + comparator, items_by_index)

    # select -------------------------------------------------------------------------------------------
    def select(self, records: PhaseRecords, step: int) -> None:
        context, round_index = self.context, records.round_index
        context.control.begin(round_index, "select", 1)
        if self.labelled:
            self.replay.add_round(round_index, self.labelled_round(records, step).pairs)
        selection = self.replay.select(round_index, context.streams.python(REPLAY_STREAM))
        self.train_pairs = list(selection.pairs)
        mode = context.config.preference_replay_mode
        sizes = self.replay.round_sizes
        records.replay_rows = [
            {
                "source_round": int(source),
                "mode": mode,
                "weight": float(weight),
                "drawn_count": int(selection.drawn.get(source, 0)),
                "num_pairs": int(sizes.get(source, 0)),  # the dataset drawn from, as the Replay page shows it
            }
            for source, weight in sorted(selection.weights.items())
        ]
        if not self.train_pairs:
            records.add_event(
                "warning",
                f"{context.algorithm_name}: no replay preference pairs were available for iteration {round_index} "
                f"(current generated {len(self.round_pairs)}).",
            )
        records.add_metrics(step, {M.TRAIN_PREFERENCE_PAIRS: len(self.train_pairs)})
        if self.reward_range is not None:
            self.record_reward_distribution(records, step)

    def record_reward_distribution(self, records: PhaseRecords, step: int) -> None:
        """CoMLRL's reward_distributions/iteration_NNNN.json (under the run's output_dir) and its store rows."""
        context, round_index = self.context, records.round_index
        selected = {
            "target": [p.target_raw_reward for p in self.train_pairs if p.target_raw_reward is not None],
            "comparator": [p.comparator_raw_reward for p in self.train_pairs if p.comparator_raw_reward is not None],
        }
        payload = distribution_payload(round_index, self.reward_range, self.round_rewards, selected)
        if payload is None:
            return
        if context.dist.is_main:
            # Differs from CoMLRL: the files go under the run's output_dir, not the W&B dir or the working directory.
            write_distribution_file(context.output_dir / DISTRIBUTION_DIR, payload)
        records.reward_distributions = distribution_rows(payload)
        for template, series, extra in (
            (M.REWARD_DISTRIBUTION, payload["candidate"], {}),
            (M.SELECTED_REWARD_DISTRIBUTION, payload["selected"], {"pair_count": len(self.train_pairs)}),
        ):
            values = {"current_iteration": round_index, **extra}
            for side in ("target", "comparator"):
                values[f"{side}_sample_count"] = series[side]["sample_count"]
                if series[side]["mean"] is not None:  # CoMLRL logs no mean for an empty side
                    values[f"{side}_mean"] = series[side]["mean"]
            records.add_metrics(step, {M.name(template, key=k): v for k, v in values.items()})

    # round hooks and state ----------------------------------------------------------------------------
    def after_train(self, round_index: int) -> None:
        if self.saves_policy_history:
            self.save_policy_snapshot(snapshot_name(round_index))

    def save_policy_snapshot(self, name: str) -> None:
        """The agents (LoRA: their adapters) under ``<history root>/<name>``; written by the main rank, read by all."""
        context = self.context
        target = self.history_dir / name
        if context.dist.is_main:
            for i, (model, tokenizer) in enumerate(zip(context.agents, context.tokenizers)):
                model.save_pretrained(target / f"agent_{i}")
                tokenizer.save_pretrained(target / f"agent_{i}")
        context.dist.barrier()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "replay": self.replay.state_dict(), "round_rewards": self.round_rewards}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.replay.load_state_dict(state["replay"])
        # Checkpoints written before reward distributions were logged have no round rewards.
        self.round_rewards = state.get("round_rewards", {"target": [], "comparator": []})


def _require_items(context: PartContext) -> list[dict]:
    if not context.train_items:
        raise ValueError(f"{context.algorithm_name} needs a train_dataset with at least one item.")
    return context.train_items


def _share(pairs: list[PreferencePair], side: str) -> float:
    return sum(1 for p in pairs if p.winner_side == side) / len(pairs) if pairs else math.nan


def _tokens_per_second(control) -> float:
    return control.tokens / max(1e-9, time.monotonic() - control.started_at)
