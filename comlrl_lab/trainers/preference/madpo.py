"""MADPO and MADPOIter: preference pairs from joint responses, then joint-margin DPO on every agent.

Read top to bottom, a round is: collect (sample, score, pair) -> select (replay sample) -> train (DPO epochs)
-> evaluate (task reward). The loss is the seed's: Δ_i = log π_i(w_i) - log π_i(l_i), Δ = Σ_i Δ_i,
L = -log σ(β Δ); agent i's gradient flows only through its own Δ_i while the others' margins are detached.

Deliberate deviations from CoMLRL (each one in docs/differences_from_comlrl.md):
- one padded forward per agent per micro-batch, winners and losers together, instead of 4·A batch-1 forwards;
  each agent's differentiable margin and the others' detached ones come from the same forward (exact when
  dropout is off, the default);
- pairs train on the token ids that were sampled, never on re-tokenised text;
- a NaN or infinite loss stops training with ``NonFiniteLossError`` before any optimiser step of that batch.

Under torchrun (``distributed.py``) each rank samples and scores its shard of the items, the rows are gathered
so every rank pairs, replays and shuffles the same data, and each rank scores a slice of every training batch;
gradients are summed over ranks, so the step is the one a single process takes on the whole batch.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from comlrl_lab.data.records import JointCandidate, PreferencePair
from comlrl_lab.models.scoring import sequence_logps
from comlrl_lab.trainers.preference.base import PreferenceTrainerBase, finite_mean
from comlrl_lab.trainers.preference.collection import map_agents, mean_reward
from comlrl_lab.trainers.preference.comparators import ComparatorContext, build_comparator
from comlrl_lab.trainers.preference.comparators.centralized import (
    TaggedCentralizedComparatorAdapter,
    validate_adapter,
)
from comlrl_lab.trainers.preference.comparators.local import INITIAL_SNAPSHOT, snapshot_name
from comlrl_lab.trainers.preference.config import MADPOConfig, MADPOIterConfig
from comlrl_lab.trainers.preference.devices import model_dtype_spec
from comlrl_lab.trainers.preference.losses import NonFiniteLossError, check_finite
from comlrl_lab.trainers.preference.pairing import base_pairs, iterative_pairs
from comlrl_lab.trainers.preference.replay import ReplayBuffer
from comlrl_lab.trainers.preference.sink import PhaseRecords

PAIRS_STREAM = "pairs"
SHUFFLE_STREAM = "shuffle"
REPLAY_STREAM = "replay"


class MADPOTrainer(PreferenceTrainerBase):
    """Collect pairs once over ``train_dataset``, then ``num_train_epochs`` of joint-margin DPO."""

    config_class = MADPOConfig
    algorithm_name = "MADPO"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.round_pairs: list[PreferencePair] = []
        self.train_pairs: list[PreferencePair] = []
        self.total_pairs = 0

    # collect ------------------------------------------------------------------------------------------
    def _phase_collect(self, records: PhaseRecords) -> None:
        items = self.train_items
        if not items:
            raise ValueError(f"{self.algorithm_name} needs a train_dataset with at least one item.")
        # Each rank samples and scores its shard of the items; the gathered rows are the same on every rank.
        indices = self.dist.shard(list(range(len(items))))
        local_items = [items[k] for k in indices]
        self.control.begin(self.round_index, "collect", len(local_items) * self.num_agents)
        local = self.collect_current(local_items, indices, self.args.preference_num_candidates)
        self.score_task([c for row in local for c in row], dict(zip(indices, local_items)))
        joint = self.gather_rows(local)
        flat = [c for row in joint for c in row]
        rng = self.streams.python(PAIRS_STREAM)
        pairs: list[PreferencePair] = []
        for row in joint:
            pairs.extend(
                base_pairs(row, selection=self.args.pair_selection, cap=self.args.preference_pairs_per_sample, rng=rng)
            )
        for pair in pairs:
            pair.round_index = self.round_index
        self.round_pairs = pairs
        self.total_pairs += len(pairs)
        records.candidates = flat
        records.pairs = pairs
        reward = mean_reward(flat)
        records.add_metrics(
            self.updates_seen,
            {
                "turn_1/reward_mean": reward,
                "turn_1/expected_return": reward,
                "pairs/collected": len(pairs),
                "collect/tokens_per_second": self.control.tokens / max(1e-9, _elapsed(self.control)),
            },
        )

    # select -------------------------------------------------------------------------------------------
    def _phase_select(self, records: PhaseRecords) -> None:
        self.control.begin(self.round_index, "select", 1)
        self.train_pairs = list(self.round_pairs)
        if not self.train_pairs:
            self.log(records, f"{self.algorithm_name}: no non-tied preference pairs were generated.", "warning")
        records.add_metrics(self.updates_seen, {"iter/train_preference_pairs": len(self.train_pairs)})

    # train --------------------------------------------------------------------------------------------
    def _phase_train(self, records: PhaseRecords) -> None:
        pairs = [self.ensure_token_ids(p) for p in self.train_pairs]
        batch_size = int(self.args.train_batch_size)
        batches_per_epoch = math.ceil(len(pairs) / batch_size) if pairs else 0
        self.control.begin(self.round_index, "train", batches_per_epoch * self.args.num_train_epochs)
        if not pairs:
            self.log(records, f"{self.algorithm_name}: no training pairs in round {self.round_index}; no policy update.")
            return
        rng = self.streams.python(SHUFFLE_STREAM)
        epoch_metrics: list[dict[str, float]] = []
        for _epoch in range(self.args.num_train_epochs):
            order = list(pairs)
            rng.shuffle(order)
            for start in range(0, len(order), batch_size):
                batch = order[start : start + batch_size]
                metrics = self.madpo_update(batch)
                tokens = metrics.pop("_tokens", 0)
                self.updates_seen += 1
                if self.args.use_environment_step:
                    self.env_step += self.args.environment_steps_per_pair * len(batch)
                records.add_metrics(self.updates_seen, metrics)
                epoch_metrics.append(metrics)
                self.control.advance(1, tokens=tokens)
        self._weights_dirty = True
        summary = {
            f"round/{name}": finite_mean([m[name] for m in epoch_metrics if name in m])
            for name in ("madpo/loss", "madpo/joint_margin", "madpo/pair_accuracy")
        }
        records.add_metrics(self.updates_seen, summary)

    def madpo_update(self, batch: list[PreferencePair]) -> dict[str, float]:
        """One optimiser step per agent on ``batch``; returns the update's metrics.

        Per micro-batch each agent runs one padded forward over its winners and losers, giving its margin
        Δ_i with grad. The joint margin uses the others' detached margins, so
        dL/dθ_i = -β σ(-β Δ) ∇Δ_i, the seed's simultaneous update.
        """
        beta = float(self.args.dpo_beta)
        micro = max(1, int(self.args.scoring_batch_size))
        total = len(batch)
        # Data parallel: this rank scores a strided slice; each loss is scaled by slice/total, so the sum of the
        # ranks' gradients is the gradient of the mean over the whole batch.
        local = self.dist.shard(batch)
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)
        for model in self.agents:
            model.train(self.train_mode_for_updates)
        sums = {"loss": 0.0, "joint": 0.0, "acc": 0.0, "tokens": 0}
        agent_sums = [{"margin": 0.0, "w": 0.0, "l": 0.0} for _ in range(self.num_agents)]
        try:
            self._accumulate_madpo_gradients(local, total, beta, micro, sums, agent_sums)
            failure = None
        except NonFiniteLossError as error:
            if not self.dist.enabled:
                raise
            failure = error  # raised below on every rank, so no rank waits in a collective
        if self.dist.enabled:
            flat = [sums["loss"], sums["joint"], sums["acc"], sums["tokens"], float(failure is not None)]
            flat += [v for values in agent_sums for v in (values["margin"], values["w"], values["l"])]
            flat = self.dist.all_reduce_sum(flat)
            if flat[4] > 0:
                for model in self.agents:
                    model.eval()
                raise failure or NonFiniteLossError(
                    f"{self.algorithm_name} loss is not finite on another rank (update {self.updates_seen + 1}); "
                    "training stopped before the optimiser step."
                )
            sums = {"loss": flat[0], "joint": flat[1], "acc": flat[2], "tokens": int(flat[3])}
            agent_sums = [
                {"margin": flat[5 + 3 * i], "w": flat[6 + 3 * i], "l": flat[7 + 3 * i]} for i in range(self.num_agents)
            ]
            for model in self.agents:
                self.dist.sum_gradients(model.parameters())
        for model, optimizer in zip(self.agents, self.optimizers):
            if self.args.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), self.args.max_grad_norm)
            optimizer.step()
            model.eval()
        reward_mean = finite_mean([p.candidate_reward_mean for p in batch])
        metrics = {
            "madpo/loss": sums["loss"] / total,
            "madpo/joint_margin": sums["joint"] / total,
            "madpo/pair_accuracy": sums["acc"] / total,
            "turn_1/reward_mean": reward_mean,
            "turn_1/expected_return": reward_mean,
            "_tokens": sums["tokens"],
        }
        for i, values in enumerate(agent_sums):
            metrics[f"madpo/agent_{i}/margin"] = values["margin"] / total
            metrics[f"logps/agent_{i}/winner"] = values["w"] / total
            metrics[f"logps/agent_{i}/loser"] = values["l"] / total
        return metrics

    def _accumulate_madpo_gradients(self, local, total, beta, micro, sums, agent_sums) -> None:
        """Backward of every agent's loss over ``local`` pairs, each micro-batch weighted by its size / ``total``."""
        for start in range(0, len(local), micro):
            chunk = local[start : start + micro]
            size = len(chunk)
            margins, winner_logps, loser_logps = [], [], []

            def score(i: int, chunk=chunk, size=size):
                prompt_ids = [p.prompt_ids[i] for p in chunk]
                completion_ids = [p.winner_ids[i] for p in chunk] + [p.loser_ids[i] for p in chunk]
                logps = sequence_logps(
                    self.agents[i],
                    prompt_ids + prompt_ids,
                    completion_ids,
                    pad_token_id=self.pad_token_id(i),
                    # Centralized joint completions are scored whole, EOS included (CoMLRL's centralized path).
                    score_final_token=self.args.score_final_token or self.centralized,
                    micro_batch_size=2 * size,
                )
                return logps, sum(len(c) for c in completion_ids)

            # Agents on distinct GPUs run their forwards in parallel threads; autograd's backward below
            # already runs one worker per device.
            for logps, tokens in map_agents(score, self.agent_devices):
                sums["tokens"] += tokens
                winner_logps.append(logps[:size])
                loser_logps.append(logps[size:])
                margins.append(logps[:size] - logps[size:])  # (size,) Δ_i with grad
            detached = torch.stack([m.detach().float().cpu() for m in margins])  # (A, size)
            joint_margin = detached.sum(dim=0)  # (size,) Δ
            losses = []
            for i, margin in enumerate(margins):
                others = (joint_margin - detached[i]).to(margin.device, margin.dtype)
                loss_i = -F.logsigmoid(beta * (margin + others)).mean()
                check_finite(loss_i, f"{self.algorithm_name} loss of agent {i} (update {self.updates_seen + 1})")
                losses.append(loss_i * (size / total))
            # Each loss_i reaches only agent i's parameters, so one backward over the sum is A separate ones.
            torch.stack([loss.to(losses[0].device) for loss in losses]).sum().backward()
            joint_loss = -F.logsigmoid(beta * joint_margin)
            sums["loss"] += float(joint_loss.sum())
            sums["joint"] += float(joint_margin.sum())
            sums["acc"] += float((joint_margin > 0).float().sum())
            for i in range(self.num_agents):
                agent_sums[i]["margin"] += float(detached[i].sum())
                agent_sums[i]["w"] += float(winner_logps[i].detach().sum())
                agent_sums[i]["l"] += float(loser_logps[i].detach().sum())

    # state --------------------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        state = super()._state()
        state.update(round_pairs=self.round_pairs, train_pairs=self.train_pairs, total_pairs=self.total_pairs)
        return state

    def _load_state(self, state: dict[str, Any]) -> None:
        super()._load_state(state)
        self.round_pairs = list(state["round_pairs"])
        self.train_pairs = list(state["train_pairs"])
        self.total_pairs = int(state["total_pairs"])

    def _end_of_round(self) -> None:
        self.round_pairs, self.train_pairs = [], []


class MADPOIterTrainer(MADPOTrainer):
    """``num_iterations`` rounds of: current agents vs a comparator, replay sample, DPO epochs."""

    config_class = MADPOIterConfig
    algorithm_name = "MADPOIter"
    iterative = True

    def __init__(self, *args: Any, centralized_comparator_adapter: Any = None, **kwargs: Any):
        super().__init__(*args, centralized_comparator_adapter=centralized_comparator_adapter, **kwargs)
        self.adapter = validate_adapter(centralized_comparator_adapter or TaggedCentralizedComparatorAdapter())
        comparator_devices = list(self.devices.comparator)
        self.comparator_devices = comparator_devices
        self.history_dir = self.output_dir / "policy_history"
        self.comparator = build_comparator(
            ComparatorContext(
                config=self.args,
                models=self.agents,
                tokenizers=self.tokenizers,
                agent_devices=self.agent_devices,
                comparator_devices=comparator_devices,
                streams=self.streams,
                sampling=self.sampling_settings(),
                history_dir=self.history_dir,
                adapter=self.adapter,
                model_config=self.model_config,
                dtype=model_dtype_spec(self.model_config),
                row_seeds=self.row_seeds if self.args.batch_invariant_sampling else None,
            )
        )
        replay_dir = self.args.preference_replay_dir or str(self.output_dir / "preference_replay")
        self.replay = ReplayBuffer(
            mode=self.args.preference_replay_mode,
            k=self.args.preference_replay_k,
            lam=self.args.preference_replay_lambda,
            sample_size=self.args.preference_replay_sample_size,
            replay_dir=replay_dir,
            num_agents=self.num_agents,
            run_id=self.run_id,
            write_files=self.dist.is_main,
        )
        self.last_selection = None

    @property
    def saves_policy_history(self) -> bool:
        return self.args.comparator_policy == "history" or self.args.policy_checkpoint_dir is not None

    def _policy_history_root(self) -> Path:
        return Path(self.args.policy_checkpoint_dir) if self.args.policy_checkpoint_dir else self.history_dir

    def _phase_collect(self, records: PhaseRecords) -> None:
        items = self.train_items
        if not items:
            raise ValueError(f"{self.algorithm_name} needs a train_dataset with at least one item.")
        if self.round_index == 1 and self.saves_policy_history:
            self._save_policy_snapshot(INITIAL_SNAPSHOT)
        # Each rank samples and scores its shard of the items (both sides); the rows are then gathered in item
        # order, so pairing below draws the same numbers on every rank and for any number of ranks.
        indices = self.dist.shard(list(range(len(items))))
        local_items = [items[k] for k in indices]
        n = int(self.args.preference_num_candidates)
        m = int(self.args.comparator_num_candidates or n)
        self.control.begin(self.round_index, "collect", 2 * len(local_items) * self.num_agents)
        current = self.collect_current(local_items, indices, n)
        self.comparator.prepare_round(self.round_index)
        try:
            prompts = [[fmt(item) for item in local_items] for fmt in self.formatters]
            comparator = self.comparator.generate(local_items, indices, prompts, m)
        finally:
            self.comparator.release()
        self.control.advance(len(local_items) * self.num_agents)
        self.score_candidates(
            [c for row in current for c in row], [c for row in comparator for c in row], dict(zip(indices, local_items))
        )
        rows = self.gather_rows(list(zip(current, comparator)))
        current, comparator = [row[0] for row in rows], [row[1] for row in rows]
        current_flat = [c for row in current for c in row]
        comparator_flat = [c for row in comparator for c in row]
        rng = self.streams.python(PAIRS_STREAM)
        pairs: list[PreferencePair] = []
        for current_row, comparator_row in zip(current, comparator):
            pairs.extend(
                iterative_pairs(
                    current_row,
                    comparator_row,
                    selection=self.args.pair_selection,
                    cap=self.args.preference_pairs_per_sample,
                    rng=rng,
                    round_index=self.round_index,
                )
            )
        self.round_pairs = pairs
        self.total_pairs += len(pairs)
        self.replay.add_round(self.round_index, pairs)
        records.candidates = current_flat + comparator_flat
        records.pairs = pairs
        unparsed = sum(1 for c in comparator_flat if not c.parsed)
        if unparsed:
            self.log(records, f"round {self.round_index}: {unparsed} comparator outputs could not be parsed and were skipped", "warning")
        reward = mean_reward(current_flat)
        records.add_metrics(
            self.updates_seen,
            {
                "turn_1/reward_mean": reward,
                "turn_1/expected_return": reward,
                "collect/comparator_reward_mean": mean_reward(comparator_flat),
                "collect/unparsed_comparator_candidates": unparsed,
                "collect/current_win_share": _share(pairs, "current"),
                "iter/current_iteration": self.round_index,
                "iter/current_preference_pairs": len(pairs),
                "iter/total_preference_pairs": self.total_pairs,
                "collect/tokens_per_second": self.control.tokens / max(1e-9, _elapsed(self.control)),
            },
        )

    def score_candidates(self, current: list[JointCandidate], comparator: list[JointCandidate], items_by_index) -> None:
        """The oracle for both sides; MARLHFIter overrides it to use its reward model."""
        self.score_task(current + comparator, items_by_index)

    def _phase_select(self, records: PhaseRecords) -> None:
        self.control.begin(self.round_index, "select", 1)
        selection = self.replay.select(self.round_index, self.streams.python(REPLAY_STREAM))
        self.last_selection = selection
        self.train_pairs = list(selection.pairs)
        mode = self.args.preference_replay_mode
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
            self.log(
                records,
                f"{self.algorithm_name}: no replay preference pairs were available for iteration {self.round_index} "
                f"(current generated {len(self.round_pairs)}).",
                "warning",
            )
        records.add_metrics(self.updates_seen, {"iter/train_preference_pairs": len(self.train_pairs)})

    def _phase_train(self, records: PhaseRecords) -> None:
        super()._phase_train(records)
        if self.saves_policy_history:
            self._save_policy_snapshot(snapshot_name(self.round_index))

    def _save_policy_snapshot(self, name: str) -> None:
        """The agents (LoRA: their adapters) under ``<history root>/<name>``; written by the main rank, read by all."""
        target = self._policy_history_root() / name
        if self.dist.is_main:
            for i, (model, tokenizer) in enumerate(zip(self.agents, self.tokenizers)):
                model.save_pretrained(target / f"agent_{i}")
                tokenizer.save_pretrained(target / f"agent_{i}")
        self.dist.barrier()

    def _state(self) -> dict[str, Any]:
        state = super()._state()
        state["replay"] = self.replay.state_dict()
        return state

    def _load_state(self, state: dict[str, Any]) -> None:
        super()._load_state(state)
        self.replay.load_state_dict(state["replay"])


def _share(pairs: list[PreferencePair], side: str) -> float:
    return sum(1 for p in pairs if p.winner_side == side) / len(pairs) if pairs else math.nan


def _elapsed(control) -> float:
    return time.monotonic() - control.started_at
