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

from comlrl_lab.data.records import PreferencePair
from comlrl_lab.models.lora import reference_scoring
from comlrl_lab.models.reference import frozen_references
from comlrl_lab.models.scoring import pair_logps, scored_token_counts, set_mode
from comlrl_lab.names import metric_names as M
from comlrl_lab.trainers.preference.base import PreferenceTrainerBase, finite_mean
from comlrl_lab.trainers.preference.config import MADPOConfig, MADPOIterConfig
from comlrl_lab.trainers.preference.learning.losses import (
    NonFiniteLossError,
    check_finite,
    madpo_losses,
    madpo_margin,
    madpo_pair_losses,
    winner_nll,
)
from comlrl_lab.trainers.preference.rounds.collectors import ComparatorCollector, CurrentCollector
from comlrl_lab.trainers.preference.rounds.context import PartContext, Trained
from comlrl_lab.trainers.preference.runtime.concurrency import map_agents
from comlrl_lab.trainers.preference.runtime.sink import PhaseRecords

if TYPE_CHECKING:
    from collections.abc import Sequence

SHUFFLE_STREAM = "shuffle"


class DPOLearner:
    """The MADPO train phase: shuffled epochs of joint-margin DPO over the selected pairs.

    The opt-in stabilisers (``madpo_reference``, ``madpo_length_normalize``, ``madpo_nll_weight``) change the
    margin and the loss; with all three off this is the seed's reference-free loss.
    """

    def __init__(self, context: PartContext):
        self.context = context
        args = context.config
        self.length_normalize = bool(args.madpo_length_normalize)
        self.nll_weight = float(args.madpo_nll_weight)
        # The reference is the agents as constructed: a resumed run loads its trained weights only afterwards.
        self.references = (
            frozen_references(context.agents, context.agent_devices, context.devices.reference)
            if args.madpo_reference == "initial"
            else None
        )

    def on_pairs_collected(self, pairs: Sequence[PreferencePair]) -> None:
        """Take the reference log-probs of new pairs once, so replayed pairs never need the reference again."""
        if self.references is None:
            return
        context = self.context
        pairs = [context.ensure_token_ids(p) for p in pairs if p.reference_winner_logps is None]
        if not pairs:
            return
        final = self._score_final_token
        with torch.no_grad():
            winners, losers = [], []
            for i, reference in enumerate(self.references):
                # Scored as the update scores the policy (packed or not), so an unchanged policy has margin 0.
                with reference_scoring(reference):
                    winner_logps, loser_logps = pair_logps(
                        reference,
                        [p.prompt_ids[i] for p in pairs],
                        [p.winner_ids[i] for p in pairs],
                        [p.loser_ids[i] for p in pairs],
                        pad_token_id=context.pad_token_id(i),
                        score_final_token=final,
                        micro_batch_size=max(1, int(context.config.scoring_batch_size)),
                        packed=context.config.pack_pair_scoring,
                    )
                winners.append(winner_logps.tolist())
                losers.append(loser_logps.tolist())
        for k, pair in enumerate(pairs):
            pair.reference_winner_logps = [float(w[k]) for w in winners]
            pair.reference_loser_logps = [float(lo[k]) for lo in losers]

    @property
    def _score_final_token(self) -> bool:
        # Centralized joint completions are scored whole, EOS included (CoMLRL's centralized path).
        return bool(self.context.config.score_final_token or self.context.centralized)

    def train(self, pairs: Sequence[PreferencePair], records: PhaseRecords, step: int) -> Trained:
        context, config = self.context, self.context.config
        pairs = [context.ensure_token_ids(p) for p in pairs]
        self.on_pairs_collected(pairs)  # imported pairs arrive without reference log-probs
        batch_size = int(config.train_batch_size)
        batches_per_epoch = math.ceil(len(pairs) / batch_size) if pairs else 0
        context.control.begin(records.round_index, "train", batches_per_epoch * config.num_train_epochs)
        if not pairs:
            records.add_event(
                "info", f"{context.algorithm_name}: no training pairs in round {records.round_index}; no policy update."
            )
            return Trained()
        rng = context.streams.python(SHUFFLE_STREAM)
        epoch_metrics: list[dict[str, float]] = []
        updates = env_steps = 0
        # The scoring mode is set once for the phase, not per update; the agents leave it in eval mode.
        try:
            for _epoch in range(config.num_train_epochs):
                order = list(pairs)
                rng.shuffle(order)
                for start in range(0, len(order), batch_size):
                    batch = order[start : start + batch_size]
                    metrics, tokens = self._update(batch, step + updates)
                    updates += 1
                    if config.use_environment_step:
                        env_steps += config.environment_steps_per_pair * len(batch)
                    records.add_metrics(step + updates, metrics)
                    epoch_metrics.append(metrics)
                    context.control.advance(1, tokens=tokens)
        finally:
            for model in context.agents:
                set_mode(model, False)
        summary = {
            M.round_summary(name): finite_mean([m[name] for m in epoch_metrics if name in m])
            for name in M.MADPO_ROUND_SUMMARY
        }
        records.add_metrics(step + updates, summary)
        return Trained(updates=updates, env_steps=env_steps, weights_changed=True)

    def update(self, batch: list[PreferencePair], step: int = 0) -> dict[str, float]:
        """One optimiser step per agent on ``batch``; returns the update's metrics (names in ``metric_names``).

        ``step`` counts the updates before this one (for messages). An empty batch is a no-op returning ``{}``, as
        CoMLRL's ``madpo_update`` treats it: no step, no metrics.
        """
        if not batch:
            return {}
        try:
            return self._update(batch, step)[0]
        finally:
            for model in self.context.agents:
                set_mode(model, False)

    def _update(self, batch: list[PreferencePair], step: int) -> tuple[dict[str, float], int]:
        """``update``, and the number of completion tokens it scored (for the progress rate)."""
        context, config, dist = self.context, self.context.config, self.context.dist
        beta = float(config.dpo_beta)
        micro = max(1, int(config.scoring_batch_size))
        total = len(batch)
        # Data parallel: this rank scores a strided slice; each loss is scaled by slice/total, so the sum of the
        # ranks' gradients is the gradient of the mean over the whole batch.
        local = dist.shard(batch)
        for optimizer in context.optimizers:
            optimizer.zero_grad(set_to_none=True)
        for model in context.agents:
            set_mode(model, context.train_mode_for_updates)
        sums = _UpdateSums(context.num_agents)
        try:
            self._accumulate_gradients(local, total, beta, micro, sums, step)
            failure = None
        except NonFiniteLossError as error:
            if not dist.enabled:
                raise
            failure = error  # raised below on every rank, so no rank waits in a collective
        if dist.enabled:
            failed = sums.all_reduce(dist, failure is not None)
            if failed:
                raise failure or NonFiniteLossError(
                    f"{context.algorithm_name} loss is not finite on another rank (update {step + 1}); "
                    "training stopped before the optimiser step."
                )
            for model in context.agents:
                dist.sum_gradients(model.parameters())
        for model, optimizer in zip(context.agents, context.optimizers):
            if config.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
        reward_mean = finite_mean([p.candidate_reward_mean for p in batch])
        metrics = {
            M.MADPO_LOSS: sums.loss / total,
            M.MADPO_JOINT_MARGIN: sums.joint / total,
            M.MADPO_PAIR_ACCURACY: sums.accuracy / total,
            M.REWARD_MEAN: reward_mean,
            M.EXPECTED_RETURN: reward_mean,
        }
        for i in range(context.num_agents):
            if self.nll_weight > 0:
                metrics[M.name(M.MADPO_WINNER_NLL, agent=i)] = sums.winner_nll[i] / total
            metrics[M.name(M.MADPO_AGENT_MARGIN, agent=i)] = sums.margins[i] / total
            metrics[M.name(M.WINNER_LOGPS, agent=i)] = sums.winner_logps[i] / total
            metrics[M.name(M.LOSER_LOGPS, agent=i)] = sums.loser_logps[i] / total
        return metrics, int(sums.tokens)

    def _accumulate_gradients(self, local, total: int, beta: float, micro: int, sums: _UpdateSums, step: int) -> None:
        """Backward of every agent's loss over ``local`` pairs, each micro-batch weighted by its size / ``total``."""
        context = self.context
        for start in range(0, len(local), micro):
            chunk = local[start : start + micro]
            size = len(chunk)

            def score(i: int, chunk=chunk, size=size):
                winners, losers = [p.winner_ids[i] for p in chunk], [p.loser_ids[i] for p in chunk]
                logps = pair_logps(
                    context.agents[i],
                    [p.prompt_ids[i] for p in chunk],
                    winners,
                    losers,
                    pad_token_id=context.pad_token_id(i),
                    score_final_token=self._score_final_token,
                    micro_batch_size=size,
                    # Differs from CoMLRL: one row [prompt | winner | loser] per pair; the prompt runs once.
                    packed=context.config.pack_pair_scoring,
                )
                return logps, sum(len(c) for c in winners + losers)

            # Agents on distinct GPUs run their forwards in parallel threads; autograd's backward below
            # already runs one worker per device.
            winner_logps, loser_logps = [], []
            concurrent = context.config.concurrent_cpu_agents
            for (winners, losers), tokens in map_agents(score, context.agent_devices, concurrent_cpu=concurrent):
                sums.tokens += tokens
                winner_logps.append(winners)
                loser_logps.append(losers)
            margins = [self._margin(chunk, i, w, lo) for i, (w, lo) in enumerate(zip(winner_logps, loser_logps))]
            losses, joint = madpo_losses(margins, beta)  # (size,) Δ_i with grad per agent -> L_i, Δ
            if self.nll_weight > 0:
                for i, winner in enumerate(winner_logps):
                    nll = winner_nll(winner, self._counts(chunk, i, "winner_ids"))
                    losses[i] = losses[i] + self.nll_weight * nll
                    sums.winner_nll[i] += float(nll.detach()) * size
            for i, loss in enumerate(losses):
                check_finite(loss, f"{context.algorithm_name} loss of agent {i} (update {step + 1})")
            # Each loss_i reaches only agent i's parameters, so one backward over the sum is A separate ones.
            torch.stack([(loss * (size / total)).to(losses[0].device) for loss in losses]).sum().backward()
            sums.add(joint, madpo_pair_losses(joint, beta), margins, winner_logps, loser_logps)

    def _margin(self, chunk: list[PreferencePair], i: int, winner_logps, loser_logps):
        """Agent i's margin Δ_i over ``chunk`` (size,), with the stabilisers the config turns on."""
        options = {}
        if self.references is not None:
            options["reference_winner_logps"] = torch.tensor([p.reference_winner_logps[i] for p in chunk])
            options["reference_loser_logps"] = torch.tensor([p.reference_loser_logps[i] for p in chunk])
        if self.length_normalize:
            options["winner_counts"] = self._counts(chunk, i, "winner_ids")
            options["loser_counts"] = self._counts(chunk, i, "loser_ids")
        return madpo_margin(winner_logps, loser_logps, **options)

    def _counts(self, chunk: list[PreferencePair], i: int, side: str) -> torch.Tensor:
        """Scored tokens of agent i's winner or loser completions (``side`` names the ids field)."""
        return torch.tensor(scored_token_counts([getattr(p, side)[i] for p in chunk], self._score_final_token))

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
        self.winner_nll = [0.0] * num_agents

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
        flat += self.margins + self.winner_logps + self.loser_logps + self.winner_nll
        flat = dist.all_reduce_sum(flat)
        a = len(self.margins)
        self.loss, self.joint, self.accuracy, self.tokens = flat[0], flat[1], flat[2], int(flat[3])
        self.margins = list(flat[5 : 5 + a])
        self.winner_logps = list(flat[5 + a : 5 + 2 * a])
        self.loser_logps = list(flat[5 + 2 * a : 5 + 3 * a])
        self.winner_nll = list(flat[5 + 3 * a : 5 + 4 * a])
        return flat[4] > 0


class MADPOTrainer(PreferenceTrainerBase):
    """Collect pairs once over ``train_dataset``, then ``num_train_epochs`` of joint-margin DPO.

    Example, two agents of the embedded tiny model on a built-in task (``tests/test_docs.py`` runs it)::

        >>> import tempfile
        >>> from comlrl_lab.data.tasks import get_task
        >>> from comlrl_lab.trainers.preference import MADPOConfig, MADPOTrainer
        >>> task = get_task("length_ratio")
        >>> trainer = MADPOTrainer(
        ...     agent_model="comlrl-lab/tiny",
        ...     num_agents=task.num_agents,
        ...     train_dataset=task.train_items()[:4],
        ...     eval_dataset=task.eval_items()[:2],
        ...     reward_func=task.reward_func,
        ...     formatters=task.formatters,
        ...     args=MADPOConfig(
        ...         preference_num_candidates=4, num_train_epochs=2, max_new_tokens=12, output_dir=tempfile.mkdtemp()
        ...     ),
        ... )
        >>> trainer.train()
        >>> trainer.finished, trainer.updates_seen > 0
        (True, True)
        >>> sorted(trainer.evaluate())
        ['eval/num_samples', 'eval/turn_1/expected_return', 'eval/turn_1/reward_mean', 'eval/turn_1/reward_sem']
    """

    config_class = MADPOConfig
    algorithm_name = "MADPO"

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.learner = DPOLearner(self.context)
        self.collector = CurrentCollector(self.context)


class MADPOIterTrainer(PreferenceTrainerBase):
    """``num_iterations`` rounds of: current agents vs a comparator, replay sample, DPO epochs.

    Example, the current agents against their own snapshot of two rounds back, training on λ-decayed replay
    (``tests/test_docs.py`` runs it)::

        >>> import tempfile
        >>> from comlrl_lab.data.tasks import get_task
        >>> from comlrl_lab.trainers.preference import MADPOIterConfig, MADPOIterTrainer
        >>> from comlrl_lab.trainers.preference.runtime.sink import MemorySink
        >>> task = get_task("length_ratio")
        >>> sink = MemorySink()  # keeps every phase's records; the workbench passes a store instead
        >>> trainer = MADPOIterTrainer(
        ...     agent_model="comlrl-lab/tiny",
        ...     num_agents=task.num_agents,
        ...     train_dataset=task.train_items()[:4],
        ...     reward_func=task.reward_func,
        ...     formatters=task.formatters,
        ...     args=MADPOIterConfig(
        ...         num_iterations=3,
        ...         preference_num_candidates=4,
        ...         max_new_tokens=12,
        ...         comparator_policy="history",
        ...         comparator_history_k=2,
        ...         preference_replay_mode="lambda_decay",
        ...         preference_replay_lambda=0.5,
        ...         output_dir=tempfile.mkdtemp(),
        ...     ),
        ...     sink=sink,
        ... )
        >>> trainer.train()
        >>> [(r.round_index, r.phase) for r in sink.phases][:4]
        [(1, 'collect'), (1, 'select'), (1, 'train'), (1, 'evaluate')]
        >>> {pair.winner_side for pair in sink.pairs()} <= {"current", "comparator"}
        True
    """

    config_class = MADPOIterConfig
    algorithm_name = "MADPOIter"
    iterative = True

    def __init__(self, *args: Any, centralized_comparator_adapter: Any = None, **kwargs: Any):
        super().__init__(*args, centralized_comparator_adapter=centralized_comparator_adapter, **kwargs)
        self.learner = DPOLearner(self.context)
        self.collector = ComparatorCollector(self.context, centralized_comparator_adapter)
