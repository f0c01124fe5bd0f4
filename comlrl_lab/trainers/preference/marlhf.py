"""MARLHF and MARLHFIter: preference pairs -> a Bradley-Terry joint reward model -> online multi-agent RL.

``RLHFLearner`` is the train phase of both: fit a freshly initialised ``JointRewardModel`` on the selected
pairs, freeze it, then ``num_train_epochs`` of policy learning with ``rl_algorithm`` against it
(``policy_learning.PolicyLearner``). Evaluation always uses fresh samples scored by the task reward, never by the
reward model.

The trainers are compositions (``base.PreferenceTrainerBase`` runs the phases):
- ``MARLHFTrainer`` = ``CurrentCollector`` + ``RLHFLearner``;
- ``MARLHFIterTrainer`` = ``ComparatorCollector`` (current agents against a comparator, replay) + ``RLHFLearner``.

In MARLHFIter with ``preference_scoring_reward="reward_model"`` the model fitted in round t labels the
comparisons of round t+1 (the task reward labels round 1): the learner offers it to the collector through
``labeling_scorer``. It is the only case where a fitted reward model outlives its train phase, and then it is
part of the checkpoint.

Metrics (names and meanings in ``names/metric_names.py``; CoMLRL logs none of the Bradley-Terry ones): ``bt/...``
per Bradley-Terry epoch (their step is the running count of BT epochs); ``rl/...`` and ``turn_1/...`` per rollout
buffer and update (step = ``updates_seen``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from comlrl_lab.data.records import JointCandidate, PreferencePair
from comlrl_lab.models.loading import load_model, load_tokenizer
from comlrl_lab.names import metric_names as M
from comlrl_lab.trainers.preference.base import PreferenceTrainerBase, finite_mean
from comlrl_lab.trainers.preference.config import MARLHFConfig, MARLHFIterConfig
from comlrl_lab.trainers.preference.learning.policy_learning import (
    PolicyLearner,
    resolve_backend,
    resolve_critic_sources,
)
from comlrl_lab.trainers.preference.learning.reward_model import JointRewardModel, fit_bradley_terry, split_validation
from comlrl_lab.trainers.preference.rounds.collection import ScoreFn
from comlrl_lab.trainers.preference.rounds.collectors import ComparatorCollector, CurrentCollector
from comlrl_lab.trainers.preference.rounds.context import PartContext, Trained
from comlrl_lab.trainers.preference.runtime.sink import PhaseRecords

REWARD_INIT_STREAM = "reward_model_init"
BT_SPLIT_STREAM = "bt_split"
BT_SHUFFLE_STREAM = "bt_shuffle"


class RLHFLearner:
    """The MARLHF train phase: a Bradley-Terry reward model fitted on the pairs, then policy learning against it.

    ``keep_reward_model`` says whether the fitted model outlives its train phase (MARLHF: the run ends with it;
    MARLHFIter: only when it labels the next round).
    """

    def __init__(
        self,
        context: PartContext,
        *,
        keep_reward_model: bool,
        metrics_callback: Callable[[list[JointCandidate]], dict[str, float]] | None = None,
        critic_model: Any = None,
        critics: Any = None,
    ):
        self.context = context
        args = context.config
        self.keep_reward_model = keep_reward_model
        self.metrics_callback = metrics_callback
        self.backend = resolve_backend(args.rl_algorithm)
        self.reward_model_source = args.reward_model_name or context.agent_sources[0]
        if not isinstance(self.reward_model_source, str):
            # Differs from CoMLRL: it fails only when the first reward model is built; here at construction.
            raise ValueError("reward_model_name must be provided when agent models are objects.")
        # Differs from CoMLRL: reward_model_device defaults to "cuda:0" there; here None follows the first agent
        # (resolved with every other device field in the trainer's DeviceLayout).
        self.reward_model_device = context.devices.reward_model[0]
        self.policy = PolicyLearner(
            config=args,
            agents=context.agents,
            tokenizers=context.tokenizers,
            optimizers=context.optimizers,
            formatters=context.formatters,
            agent_devices=context.agent_devices,
            streams=context.streams,
            sampling=context.sampling_settings(),
            critic_sources=resolve_critic_sources(
                args, context.agent_sources, critics=critics, critic_model=critic_model
            ),
            model_config=context.model_config,
            pad_token_ids=[context.pad_token_id(i) for i in range(context.num_agents)],
            reference_devices=context.devices.reference,
            critic_devices=context.devices.critics,
            dist=context.dist,
        )
        self.reward_model: JointRewardModel | None = None
        self._reward_tokenizer: Any = None
        self.bt_epochs_seen = 0

    # train --------------------------------------------------------------------------------------------
    def on_pairs_collected(self, pairs: Sequence[PreferencePair]) -> None:
        """Nothing to annotate: the reward model is fitted on the pairs' texts at train time."""

    def train(self, pairs: Sequence[PreferencePair], records: PhaseRecords, step: int) -> Trained:
        context, args = self.context, self.context.config
        texts = [self.pair_texts(p) for p in pairs]
        train_texts, val_texts = self.split_pairs(texts)
        bt_batches = -(-len(train_texts) // int(args.reward_train_batch_size)) * int(args.reward_num_train_epochs)
        buffers = -(-len(context.train_items) // int(args.rollout_buffer_size)) * int(args.num_train_epochs)
        context.control.begin(records.round_index, "train", bt_batches + buffers if texts else 0)
        if not texts:
            records.add_event(
                "info", f"{context.algorithm_name}: no training pairs in round {records.round_index}; no policy update."
            )
            return Trained()
        self.reward_model = None  # free last round's model before the new one is loaded
        self.reward_model = self.fit_reward_model(train_texts, val_texts, records)
        trained = self.learn_policy(records, step)
        if not self.keep_reward_model:
            self.reward_model = None
        return trained

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
            len(texts),
            float(self.context.config.bt_validation_fraction),
            self.context.streams.python(BT_SPLIT_STREAM),
            keys=texts,
        )
        return [texts[i] for i in train_idx], [texts[i] for i in val_idx]

    def build_reward_model(self) -> JointRewardModel:
        """A freshly initialised reward model: the pretrained backbone and a new head from the seeded stream."""
        options = self.context.model_config
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
            generator=self.context.streams.torch(REWARD_INIT_STREAM, "cpu"),
            max_length=self.context.config.reward_max_length,
            freeze_backbone=bool(self.context.config.reward_freeze_backbone),
            packed=bool(self.context.config.pack_pair_scoring),
        )

    def fit_reward_model(
        self, train_texts: list[tuple[str, str]], val_texts: list[tuple[str, str]], records: PhaseRecords
    ) -> JointRewardModel:
        """A fresh reward model fitted with -log σ(R(w) - R(l)) on (winner, loser) texts, then frozen."""
        context, args = self.context, self.context.config
        model = self.build_reward_model()
        history = fit_bradley_terry(
            model,
            train_texts,
            val_texts,
            epochs=int(args.reward_num_train_epochs),
            batch_size=int(args.reward_train_batch_size),
            learning_rate=float(args.reward_learning_rate),
            rng=context.streams.python(BT_SHUFFLE_STREAM),
            micro_batch_size=int(args.scoring_batch_size),
            dropout=not args.disable_dropout,
            max_grad_norm=args.max_grad_norm,
            on_batch=lambda: context.control.advance(1),
            adamw_implementation=args.adamw_implementation,
            dist=context.dist,
        )
        for metrics in history:
            self.bt_epochs_seen += 1
            records.add_metrics(
                self.bt_epochs_seen, {**metrics, M.BT_TRAIN_PAIRS: len(train_texts), M.BT_VAL_PAIRS: len(val_texts)}
            )
        return _frozen(model)

    def reward_scores(self, candidates: list[JointCandidate]) -> list[float]:
        """The frozen reward model's scores (no reward_processor, as in CoMLRL)."""
        if self.reward_model is None:
            raise RuntimeError("no reward model has been fitted yet")
        return self.reward_model.score_candidates(
            candidates, micro_batch_size=2 * int(self.context.config.scoring_batch_size)
        )

    def labeling_scorer(self) -> ScoreFn | None:
        """The oracle for the next round's comparisons: the last fitted reward model when the config asks for it
        (``preference_scoring_reward="reward_model"``) and one exists; None means the task reward."""
        if (
            getattr(self.context.config, "preference_scoring_reward", "task") == "reward_model"
            and self.reward_model is not None
        ):
            return self.reward_scores
        return None

    def learn_policy(self, records: PhaseRecords, step: int) -> Trained:
        """``num_train_epochs`` passes over the train items in buffers of ``rollout_buffer_size``."""
        context = self.context
        items = context.train_items
        size = int(context.config.rollout_buffer_size)
        losses, rewards = [], []
        updates = env_steps = 0
        for epoch in range(int(context.config.num_train_epochs)):
            for start in range(0, len(items), size):
                indices = list(range(start, min(start + size, len(items))))
                # An item recurs once per epoch, so the epoch is part of its rollout seeds' name.
                seeds = [
                    context.row_seeds(f"rl/{epoch}", indices, i, records.round_index) for i in range(context.num_agents)
                ]
                rollout = self.policy.rollout([items[k] for k in indices], indices, self.reward_scores, seeds)
                env_steps += self.policy.num_generations * len(indices)
                metrics = dict(rollout.metrics)
                if self.metrics_callback is not None:
                    flat = [c for row in rollout.candidates for c in row]
                    extra = self.metrics_callback(flat) or {}
                    metrics.update({M.name(M.RL_CALLBACK, key=k): float(v) for k, v in extra.items()})
                records.add_metrics(step + updates, metrics)
                rewards.append(metrics[M.RL_REWARD_MODEL_MEAN])
                for update in self.policy.update(rollout):
                    updates += 1
                    records.add_metrics(step + updates, update)
                    losses.append(update[M.RL_LOSS])
                tokens = sum(sum(c.token_counts) for row in rollout.candidates for c in row)
                context.control.advance(1, tokens=tokens)
        per_round = {M.RL_LOSS: losses, M.RL_REWARD_MODEL_MEAN: rewards}
        records.add_metrics(
            step + updates, {M.round_summary(name): finite_mean(per_round[name]) for name in M.RL_ROUND_SUMMARY}
        )
        return Trained(updates=updates, env_steps=env_steps, weights_changed=True)

    # state --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"bt_epochs_seen": self.bt_epochs_seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.bt_epochs_seen = int(state.get("bt_epochs_seen", 0))

    def extra_weights(self) -> dict[str, Any]:
        keep = self.reward_model is not None and self.keep_reward_model
        return {
            "policy_learning": self.policy.state_dict(),
            "reward_model": {k: v.detach().cpu() for k, v in self.reward_model.state_dict().items()} if keep else None,
        }

    def load_extra_weights(self, weights: dict[str, Any]) -> None:
        self.policy.load_state_dict(weights.get("policy_learning", {}))
        self.reward_model = None
        saved = weights.get("reward_model")
        if saved is not None:
            # The head init draws from a stream that the trainer's state restores afterwards, so resume stays exact.
            model = self.build_reward_model()
            model.load_state_dict(saved)
            self.reward_model = _frozen(model)


def _frozen(model: JointRewardModel) -> JointRewardModel:
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model.eval()


class MARLHFTrainer(PreferenceTrainerBase):
    """Collect pairs once, fit the joint reward model, then learn the policies against it.

    Example, with a critic per agent (``rl_algorithm="iac"``; ``tests/test_docs.py`` runs it)::

        >>> import tempfile
        >>> from comlrl_lab.data.tasks import get_task
        >>> from comlrl_lab.trainers.preference import MARLHFConfig, MARLHFTrainer
        >>> task = get_task("length_ratio")
        >>> trainer = MARLHFTrainer(
        ...     agent_model="comlrl-lab/tiny",
        ...     num_agents=task.num_agents,
        ...     train_dataset=task.train_items()[:4],
        ...     reward_func=task.reward_func,
        ...     formatters=task.formatters,
        ...     args=MARLHFConfig(
        ...         rl_algorithm="iac",
        ...         preference_num_candidates=4,
        ...         num_train_epochs=1,
        ...         num_generations=2,
        ...         max_new_tokens=12,
        ...         output_dir=tempfile.mkdtemp(),
        ...     ),
        ... )
        >>> trainer.train()
        >>> trainer.learner.reward_model is not None  # MARLHF ends with the reward model it fitted
        True
    """

    config_class = MARLHFConfig
    algorithm_name = "MARLHF"

    def __init__(
        self, *args: Any, metrics_callback: Any = None, critic_model: Any = None, critics: Any = None, **kwargs: Any
    ):
        super().__init__(*args, **kwargs)
        self.learner = RLHFLearner(
            self.context,
            keep_reward_model=True,
            metrics_callback=metrics_callback,
            critic_model=critic_model,
            critics=critics,
        )
        self.collector = CurrentCollector(self.context)


class MARLHFIterTrainer(PreferenceTrainerBase):
    """``num_iterations`` rounds of: current agents vs a comparator, replay sample, a fresh reward model fitted
    on it, policy learning.

    Example, where the reward model fitted in a round labels the next round's comparisons
    (``tests/test_docs.py`` runs it)::

        >>> import tempfile
        >>> from comlrl_lab.data.tasks import get_task
        >>> from comlrl_lab.trainers.preference import MARLHFIterConfig, MARLHFIterTrainer
        >>> task = get_task("length_ratio")
        >>> trainer = MARLHFIterTrainer(
        ...     agent_model="comlrl-lab/tiny",
        ...     num_agents=task.num_agents,
        ...     train_dataset=task.train_items()[:4],
        ...     reward_func=task.reward_func,
        ...     formatters=task.formatters,
        ...     args=MARLHFIterConfig(
        ...         num_iterations=2,
        ...         preference_num_candidates=4,
        ...         preference_scoring_reward="reward_model",
        ...         num_train_epochs=1,
        ...         num_generations=2,
        ...         max_new_tokens=12,
        ...         output_dir=tempfile.mkdtemp(),
        ...     ),
        ... )
        >>> trainer.train()
        >>> trainer.round_index, trainer.finished  # rounds are 1-based: the cursor stops after the last one
        (3, True)
    """

    config_class = MARLHFIterConfig
    algorithm_name = "MARLHFIter"
    iterative = True

    def __init__(
        self,
        *args: Any,
        centralized_comparator_adapter: Any = None,
        metrics_callback: Any = None,
        critic_model: Any = None,
        critics: Any = None,
        **kwargs: Any,
    ):
        super().__init__(*args, centralized_comparator_adapter=centralized_comparator_adapter, **kwargs)
        self.learner = RLHFLearner(
            self.context,
            keep_reward_model=self.args.preference_scoring_reward == "reward_model",
            metrics_callback=metrics_callback,
            critic_model=critic_model,
            critics=critics,
        )
        self.collector = ComparatorCollector(
            self.context, centralized_comparator_adapter, model_scorer=self.learner.labeling_scorer
        )
