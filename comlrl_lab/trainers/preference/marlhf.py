"""MARLHF and MARLHFIter: preference pairs -> a Bradley-Terry joint reward model -> online multi-agent RL.

Read top to bottom, a round is: collect (sample, score with the task reward, pair; MADPO's phases) -> select
(the round's pairs, or a replay sample in MARLHFIter) -> train (fit a freshly initialised ``JointRewardModel``
on the pairs, freeze it, then ``num_train_epochs`` of policy learning with ``rl_algorithm`` against it) ->
evaluate (fresh samples scored by the task reward, never by the reward model).

In MARLHFIter with ``preference_scoring_reward="reward_model"`` the model fitted in round t labels the
comparisons of round t+1 (the task reward labels round 1). It is the only case where a fitted reward model
outlives its train phase, and then it is part of the checkpoint.

Metrics (CoMLRL logs none of the first group): ``bt/loss``, ``bt/accuracy``, ``bt/margin``, ``bt/val_loss``,
``bt/val_accuracy``, ``bt/val_margin`` per Bradley-Terry epoch (their step is the running count of BT epochs);
``rl/loss``, ``rl/reward_model_mean``, ``turn_1/reward_mean`` (reward-model scores, as CoMLRL),
``turn_1/reference_kl_mean``, ``rl/value_loss`` ... per rollout buffer and update (step = ``updates_seen``).
"""

from __future__ import annotations

from typing import Any

from comlrl_lab.data.records import JointCandidate, PreferencePair
from comlrl_lab.models.loading import load_model, load_tokenizer
from comlrl_lab.trainers.preference.base import finite_mean
from comlrl_lab.trainers.preference.collection import score_with
from comlrl_lab.trainers.preference.config import MARLHFConfig, MARLHFIterConfig
from comlrl_lab.trainers.preference.madpo import MADPOIterTrainer, MADPOTrainer
from comlrl_lab.trainers.preference.policy_learning import (
    PolicyLearner,
    resolve_backend,
    resolve_critic_sources,
)
from comlrl_lab.trainers.preference.reward_model import JointRewardModel, fit_bradley_terry, split_validation
from comlrl_lab.trainers.preference.sink import PhaseRecords

REWARD_INIT_STREAM = "reward_model_init"
BT_SPLIT_STREAM = "bt_split"
BT_SHUFFLE_STREAM = "bt_shuffle"


class MARLHFTrainer(MADPOTrainer):
    """Collect pairs once, fit the joint reward model, then learn the policies against it."""

    config_class = MARLHFConfig
    algorithm_name = "MARLHF"

    def __init__(
        self,
        *args: Any,
        metrics_callback: Any = None,
        critic_model: Any = None,
        critics: Any = None,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        self.metrics_callback = metrics_callback
        self.backend = resolve_backend(self.args.rl_algorithm)
        self.reward_model_source = self.args.reward_model_name or self.agent_sources[0]
        if not isinstance(self.reward_model_source, str):
            raise ValueError("reward_model_name must be provided when agent models are objects.")
        # Differs from CoMLRL: reward_model_device defaults to "cuda:0" there; here None follows the first agent
        # (resolved with every other device field in the trainer's DeviceLayout).
        self.reward_model_device = self.devices.reward_model[0]
        self.learner = PolicyLearner(
            config=self.args,
            agents=self.agents,
            tokenizers=self.tokenizers,
            optimizers=self.optimizers,
            formatters=self.formatters,
            agent_devices=self.agent_devices,
            streams=self.streams,
            sampling=self.sampling_settings(),
            critic_sources=resolve_critic_sources(
                self.args, self.agent_sources, critics=critics, critic_model=critic_model
            ),
            model_config=self.model_config,
            pad_token_ids=[self.pad_token_id(i) for i in range(self.num_agents)],
            reference_devices=self.devices.reference,
            critic_devices=self.devices.critics,
        )
        self.reward_model: JointRewardModel | None = None
        self._reward_tokenizer: Any = None
        self.bt_epochs_seen = 0

    @property
    def keeps_reward_model(self) -> bool:
        """Whether the fitted model outlives its train phase: it labels the next round, or the run ends with it."""
        return not self.iterative or getattr(self.args, "preference_scoring_reward", "task") == "reward_model"

    # train --------------------------------------------------------------------------------------------
    def _phase_train(self, records: PhaseRecords) -> None:
        texts = [self.pair_texts(p) for p in self.train_pairs]
        train_texts, val_texts = self.split_pairs(texts)
        bt_batches = -(-len(train_texts) // int(self.args.reward_train_batch_size)) * int(self.args.reward_num_train_epochs)
        buffers = -(-len(self.train_items) // int(self.args.rollout_buffer_size)) * int(self.args.num_train_epochs)
        self.control.begin(self.round_index, "train", bt_batches + buffers if texts else 0)
        if not texts:
            self.log(records, f"{self.algorithm_name}: no training pairs in round {self.round_index}; no policy update.")
            return
        self.reward_model = None  # free last round's model before the new one is loaded
        self.reward_model = self.fit_reward_model(train_texts, val_texts, records)
        self.learn_policy(records)
        self._weights_dirty = True
        if not self.keeps_reward_model:
            self.reward_model = None

    @staticmethod
    def pair_texts(pair: PreferencePair) -> tuple[str, str]:
        """(winner, loser) joint texts; training uses the pair's prompts, as in CoMLRL."""
        return (
            JointRewardModel.joint_text(pair.prompts, pair.winner_completions),
            JointRewardModel.joint_text(pair.prompts, pair.loser_completions),
        )

    def split_pairs(self, texts: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """Training and held-out pairs (``bt_validation_fraction``); a pair drawn twice stays on one side."""
        train_idx, val_idx = split_validation(
            len(texts), float(self.args.bt_validation_fraction), self.streams.python(BT_SPLIT_STREAM), keys=texts
        )
        return [texts[i] for i in train_idx], [texts[i] for i in val_idx]

    def build_reward_model(self) -> JointRewardModel:
        """A freshly initialised reward model: the pretrained backbone and a new head from the seeded stream."""
        options = self.model_config
        backbone = load_model(
            self.reward_model_source,
            device=self.reward_model_device,
            dtype=options.get("dtype", options.get("torch_dtype")),
            model_kwargs=options.get("model_kwargs"),
            attn_implementation=options.get("attn_implementation", "sdpa"),
        )
        if self._reward_tokenizer is None:
            self._reward_tokenizer = load_tokenizer(self.reward_model_source)
        return JointRewardModel.from_backbone(
            backbone,
            self._reward_tokenizer,
            generator=self.streams.torch(REWARD_INIT_STREAM, "cpu"),
            max_length=self.args.reward_max_length,
            freeze_backbone=bool(self.args.reward_freeze_backbone),
        )

    def fit_reward_model(
        self, train_texts: list[tuple[str, str]], val_texts: list[tuple[str, str]], records: PhaseRecords
    ) -> JointRewardModel:
        """A fresh reward model fitted with -log σ(R(w) - R(l)) on (winner, loser) texts, then frozen."""
        model = self.build_reward_model()
        history = fit_bradley_terry(
            model,
            train_texts,
            val_texts,
            epochs=int(self.args.reward_num_train_epochs),
            batch_size=int(self.args.reward_train_batch_size),
            learning_rate=float(self.args.reward_learning_rate),
            rng=self.streams.python(BT_SHUFFLE_STREAM),
            micro_batch_size=int(self.args.scoring_batch_size),
            dropout=not self.args.disable_dropout,
            max_grad_norm=self.args.max_grad_norm,
            on_batch=lambda: self.control.advance(1),
        )
        for metrics in history:
            self.bt_epochs_seen += 1
            records.add_metrics(
                self.bt_epochs_seen, {**metrics, "bt/train_pairs": len(train_texts), "bt/val_pairs": len(val_texts)}
            )
        for parameter in model.parameters():
            parameter.requires_grad_(False)
        model.eval()
        return model

    def reward_scores(self, candidates: list[JointCandidate]) -> list[float]:
        """The frozen reward model's scores (no reward_processor, as in CoMLRL)."""
        if str(getattr(self.args, "joint_mode", "aligned")).lower() not in ("aligned", "align"):
            raise ValueError("MARLHF reward model currently supports aligned joint_mode only.")
        if self.reward_model is None:
            raise RuntimeError("no reward model has been fitted yet")
        return self.reward_model.score_candidates(candidates, micro_batch_size=2 * int(self.args.scoring_batch_size))

    def learn_policy(self, records: PhaseRecords) -> None:
        """``num_train_epochs`` passes over the train items in buffers of ``rollout_buffer_size``."""
        items = self.train_items
        size = int(self.args.rollout_buffer_size)
        losses, rewards = [], []
        for _epoch in range(int(self.args.num_train_epochs)):
            for start in range(0, len(items), size):
                indices = list(range(start, min(start + size, len(items))))
                rollout = self.learner.rollout([items[k] for k in indices], indices, self.reward_scores)
                self.env_step += self.learner.num_generations * len(indices)
                metrics = dict(rollout.metrics)
                if self.metrics_callback is not None:
                    flat = [c for row in rollout.candidates for c in row]
                    metrics.update({f"rl/{k}": float(v) for k, v in (self.metrics_callback(flat) or {}).items()})
                records.add_metrics(self.updates_seen, metrics)
                rewards.append(metrics["rl/reward_model_mean"])
                for update in self.learner.update(rollout):
                    self.updates_seen += 1
                    records.add_metrics(self.updates_seen, update)
                    losses.append(update["rl/loss"])
                tokens = sum(sum(c.token_counts) for row in rollout.candidates for c in row)
                self.control.advance(1, tokens=tokens)
        records.add_metrics(
            self.updates_seen, {"round/rl/loss": finite_mean(losses), "round/rl/reward_model_mean": finite_mean(rewards)}
        )

    # state --------------------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        state = super()._state()
        state["bt_epochs_seen"] = self.bt_epochs_seen
        return state

    def _load_state(self, state: dict[str, Any]) -> None:
        super()._load_state(state)
        self.bt_epochs_seen = int(state.get("bt_epochs_seen", 0))

    def _extra_weights(self) -> dict[str, Any]:
        weights = super()._extra_weights()
        weights["policy_learning"] = self.learner.state_dict()
        keep = self.reward_model is not None and self.keeps_reward_model
        weights["reward_model"] = (
            {k: v.detach().cpu() for k, v in self.reward_model.state_dict().items()} if keep else None
        )
        return weights

    def _load_extra_weights(self, weights: dict[str, Any]) -> None:
        super()._load_extra_weights(weights)
        self.learner.load_state_dict(weights.get("policy_learning", {}))
        self.reward_model = None
        saved = weights.get("reward_model")
        if saved is not None:
            # The head init draws from a stream that _load_state restores afterwards, so resume stays exact.
            model = self.build_reward_model()
            model.load_state_dict(saved)
            for parameter in model.parameters():
                parameter.requires_grad_(False)
            self.reward_model = model.eval()


class MARLHFIterTrainer(MADPOIterTrainer, MARLHFTrainer):
    """``num_iterations`` rounds of: current agents vs a comparator, replay sample, a fresh reward model fitted
    on it, policy learning. MRO: MADPOIter's collect/select, MARLHF's train."""

    config_class = MARLHFIterConfig
    algorithm_name = "MARLHFIter"
    iterative = True

    def score_candidates(
        self, current: list[JointCandidate], comparator: list[JointCandidate], items_by_index: dict[int, dict]
    ) -> None:
        """The oracle of new comparisons: the last fitted reward model when asked for and one exists, else the task."""
        if self.args.preference_scoring_reward == "reward_model" and self.reward_model is not None:
            score_with(current + comparator, self.reward_scores)
            return
        super().score_candidates(current, comparator, items_by_index)
