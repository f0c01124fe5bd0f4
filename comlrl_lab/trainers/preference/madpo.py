"""MADPO and MADPOIter: joint-margin DPO on every agent, and the two trainers composed from it.

``DPOLearner`` is the train phase of both: ``num_train_epochs`` passes over the selected pairs, one optimiser
step per agent per batch. The loss is the seed's, computed by ``losses.madpo_losses``:
Δ_i = log π_i(w_i) - log π_i(l_i), Δ = Σ_i Δ_i, L = -log σ(β Δ); agent i's gradient flows only through its own
Δ_i while the others' margins are detached.

The trainers are compositions (``base.PreferenceTrainerBase`` runs the phases):
- ``MADPOTrainer`` = ``CurrentCollector`` (pairs within the current agents' candidates) + ``DPOLearner``;
- ``MADPOIterTrainer`` = ``ComparatorCollector`` (current agents against a comparator, replay) + ``DPOLearner``.

Deliberate deviations from CoMLRL (each one in docs/differences_from_comlrl.md):
- one padded forward per agent per micro-batch, winners and losers together, instead of 4·A batch-1 forwards;
  by default each pair is one row [prompt | winner | loser] with a block-causal mask (``pack_pair_scoring``), so
  the prompt runs once per pair (equal log-probs up to float rounding);
  each agent's differentiable margin and the others' detached ones come from the same forward (exact when
  dropout is off, the default);
- pairs train on the token ids that were sampled, never on re-tokenised text;
- a NaN or infinite loss stops training with ``NonFiniteLossError`` before any optimiser step of that batch.

Under torchrun (``distributed.py``) each rank scores a slice of every training batch; gradients are summed over
ranks, so the step is the one a single process takes on the whole batch.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from comlrl_lab.data import metric_names as M
from comlrl_lab.data.records import PreferencePair
from comlrl_lab.models.scoring import pair_logps, set_mode
from comlrl_lab.trainers.preference.base import PreferenceTrainerBase, finite_mean
from comlrl_lab.trainers.preference.collection import map_agents
from comlrl_lab.trainers.preference.collectors import ComparatorCollector, CurrentCollector
from comlrl_lab.trainers.preference.config import MADPOConfig, MADPOIterConfig
from comlrl_lab.trainers.preference.losses import (
    NonFiniteLossError,
    check_finite,
    madpo_losses,
    madpo_pair_losses,
)
from comlrl_lab.trainers.preference.sink import PhaseRecords

if TYPE_CHECKING:
    from collections.abc import Sequence

SHUFFLE_STREAM = "shuffle"


class DPOLearner:
    """The MADPO train phase: shuffled epochs of joint-margin DPO over the selected pairs."""

    def __init__(self, host: PreferenceTrainerBase):
        self.host = host

    def train(self, pairs: Sequence[PreferencePair], records: PhaseRecords) -> None:
        host = self.host
        pairs = [host.ensure_token_ids(p) for p in pairs]
        batch_size = int(host.args.train_batch_size)
        batches_per_epoch = math.ceil(len(pairs) / batch_size) if pairs else 0
        host.control.begin(host.round_index, "train", batches_per_epoch * host.args.num_train_epochs)
        if not pairs:
            host.log(
                records, f"{host.algorithm_name}: no training pairs in round {host.round_index}; no policy update."
            )
            return
        rng = host.streams.python(SHUFFLE_STREAM)
        epoch_metrics: list[dict[str, float]] = []
        # The scoring mode is set once for the phase, not per update; the agents leave it in eval mode.
        try:
            for _epoch in range(host.args.num_train_epochs):
                order = list(pairs)
                rng.shuffle(order)
                for start in range(0, len(order), batch_size):
                    batch = order[start : start + batch_size]
                    metrics, tokens = self._update(batch)
                    host.updates_seen += 1
                    if host.args.use_environment_step:
                        host.env_step += host.args.environment_steps_per_pair * len(batch)
                    records.add_metrics(host.updates_seen, metrics)
                    epoch_metrics.append(metrics)
                    host.control.advance(1, tokens=tokens)
        finally:
            for model in host.agents:
                set_mode(model, False)
        host.mark_weights_changed()
        summary = {
            M.round_summary(name): finite_mean([m[name] for m in epoch_metrics if name in m])
            for name in M.MADPO_ROUND_SUMMARY
        }
        records.add_metrics(host.updates_seen, summary)

    def update(self, batch: list[PreferencePair]) -> dict[str, float]:
        """One optimiser step per agent on ``batch``; returns the update's metrics (names in ``metric_names``)."""
        try:
            return self._update(batch)[0]
        finally:
            for model in self.host.agents:
                set_mode(model, False)

    def _update(self, batch: list[PreferencePair]) -> tuple[dict[str, float], int]:
        """``update``, and the number of completion tokens it scored (for the progress rate)."""
        host = self.host
        beta = float(host.args.dpo_beta)
        micro = max(1, int(host.args.scoring_batch_size))
        total = len(batch)
        # Data parallel: this rank scores a strided slice; each loss is scaled by slice/total, so the sum of the
        # ranks' gradients is the gradient of the mean over the whole batch.
        local = host.dist.shard(batch)
        for optimizer in host.optimizers:
            optimizer.zero_grad(set_to_none=True)
        for model in host.agents:
            set_mode(model, host.train_mode_for_updates)
        sums = _UpdateSums(host.num_agents)
        try:
            self._accumulate_gradients(local, total, beta, micro, sums)
            failure = None
        except NonFiniteLossError as error:
            if not host.dist.enabled:
                raise
            failure = error  # raised below on every rank, so no rank waits in a collective
        if host.dist.enabled:
            failed = sums.all_reduce(host.dist, failure is not None)
            if failed:
                raise failure or NonFiniteLossError(
                    f"{host.algorithm_name} loss is not finite on another rank (update {host.updates_seen + 1}); "
                    "training stopped before the optimiser step."
                )
            for model in host.agents:
                host.dist.sum_gradients(model.parameters())
        for model, optimizer in zip(host.agents, host.optimizers):
            if host.args.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), host.args.max_grad_norm)
            optimizer.step()
        reward_mean = finite_mean([p.candidate_reward_mean for p in batch])
        metrics = {
            M.MADPO_LOSS: sums.loss / total,
            M.MADPO_JOINT_MARGIN: sums.joint / total,
            M.MADPO_PAIR_ACCURACY: sums.accuracy / total,
            M.REWARD_MEAN: reward_mean,
            M.EXPECTED_RETURN: reward_mean,
        }
        for i in range(host.num_agents):
            metrics[M.name(M.MADPO_AGENT_MARGIN, agent=i)] = sums.margins[i] / total
            metrics[M.name(M.WINNER_LOGPS, agent=i)] = sums.winner_logps[i] / total
            metrics[M.name(M.LOSER_LOGPS, agent=i)] = sums.loser_logps[i] / total
        return metrics, int(sums.tokens)

    def _accumulate_gradients(self, local, total: int, beta: float, micro: int, sums: _UpdateSums) -> None:
        """Backward of every agent's loss over ``local`` pairs, each micro-batch weighted by its size / ``total``."""
        host = self.host
        for start in range(0, len(local), micro):
            chunk = local[start : start + micro]
            size = len(chunk)

            def score(i: int, chunk=chunk, size=size):
                winners, losers = [p.winner_ids[i] for p in chunk], [p.loser_ids[i] for p in chunk]
                logps = pair_logps(
                    host.agents[i],
                    [p.prompt_ids[i] for p in chunk],
                    winners,
                    losers,
                    pad_token_id=host.pad_token_id(i),
                    # Centralized joint completions are scored whole, EOS included (CoMLRL's centralized path).
                    score_final_token=host.args.score_final_token or host.centralized,
                    micro_batch_size=size,
                    # Differs from CoMLRL: one row [prompt | winner | loser] per pair; the prompt runs once.
                    packed=host.args.pack_pair_scoring,
                )
                return logps, sum(len(c) for c in winners + losers)

            # Agents on distinct GPUs run their forwards in parallel threads; autograd's backward below
            # already runs one worker per device.
            winner_logps, loser_logps = [], []
            for (winners, losers), tokens in map_agents(score, host.agent_devices):
                sums.tokens += tokens
                winner_logps.append(winners)
                loser_logps.append(losers)
            margins = [w - lo for w, lo in zip(winner_logps, loser_logps)]  # (size,) Δ_i with grad, per agent
            losses, joint = madpo_losses(margins, beta)
            for i, loss in enumerate(losses):
                check_finite(loss, f"{host.algorithm_name} loss of agent {i} (update {host.updates_seen + 1})")
            # Each loss_i reaches only agent i's parameters, so one backward over the sum is A separate ones.
            torch.stack([(loss * (size / total)).to(losses[0].device) for loss in losses]).sum().backward()
            sums.add(joint, madpo_pair_losses(joint, beta), margins, winner_logps, loser_logps)

    # state: everything DPO trains lives in the agents and optimisers, which the trainer checkpoints itself.
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def extra_weights(self) -> dict[str, Any]:
        return {}

    def load_extra_weights(self, weights: dict[str, Any]) -> None:
        return None


class _UpdateSums:
    """Per-pair sums over one update's micro-batches (and ranks), divided by the pair count at the end."""

    def __init__(self, num_agents: int):
        self.loss = self.joint = self.accuracy = 0.0
        self.tokens = 0
        self.margins = [0.0] * num_agents
        self.winner_logps = [0.0] * num_agents
        self.loser_logps = [0.0] * num_agents

    def add(self, joint, pair_losses, margins, winner_logps, loser_logps) -> None:
        self.loss += float(pair_losses.sum())
        self.joint += float(joint.sum())
        self.accuracy += float((joint > 0).float().sum())
        for i, (margin, winner, loser) in enumerate(zip(margins, winner_logps, loser_logps)):
            self.margins[i] += float(margin.detach().sum())
            self.winner_logps[i] += float(winner.detach().sum())
            self.loser_logps[i] += float(loser.detach().sum())

    def all_reduce(self, dist, failed_here: bool) -> bool:
        """Sum every rank's sums in place; True when any rank's loss was not finite."""
        flat = [self.loss, self.joint, self.accuracy, float(self.tokens), float(failed_here)]
        flat += self.margins + self.winner_logps + self.loser_logps
        flat = dist.all_reduce_sum(flat)
        a = len(self.margins)
        self.loss, self.joint, self.accuracy, self.tokens = flat[0], flat[1], flat[2], int(flat[3])
        self.margins = list(flat[5 : 5 + a])
        self.winner_logps = list(flat[5 + a : 5 + 2 * a])
        self.loser_logps = list(flat[5 + 2 * a : 5 + 3 * a])
        return flat[4] > 0


class MADPOTrainer(PreferenceTrainerBase):
    """Collect pairs once over ``train_dataset``, then ``num_train_epochs`` of joint-margin DPO."""

    config_class = MADPOConfig
    algorithm_name = "MADPO"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.learner = DPOLearner(self)
        self.collector = CurrentCollector(self)


class MADPOIterTrainer(PreferenceTrainerBase):
    """``num_iterations`` rounds of: current agents vs a comparator, replay sample, DPO epochs."""

    config_class = MADPOIterConfig
    algorithm_name = "MADPOIter"
    iterative = True

    def __init__(self, *args: Any, centralized_comparator_adapter: Any = None, **kwargs: Any):
        super().__init__(*args, centralized_comparator_adapter=centralized_comparator_adapter, **kwargs)
        self.learner = DPOLearner(self)
        self.collector = ComparatorCollector(self, centralized_comparator_adapter)
