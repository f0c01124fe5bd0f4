"""What every preference trainer shares: CoMLRL's constructor, the phase machine, evaluation and checkpoints.

A trainer advances one phase at a time (``step()``): collect -> select -> train -> evaluate, round after
round. ``train()`` simply steps until done, so the Python API, the CLI and the workbench's background engine all
drive the same code. Each public trainer is a composition: it sets ``self.collector`` (collect and select:
``collectors.py``) and ``self.learner`` (train: ``madpo.DPOLearner`` or ``marlhf.RLHFLearner``); this module owns
the cursor, evaluation, the commit of each phase's records to the sink, and the checkpoint written after it. It
does not know about DuckDB or Streamlit.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from comlrl_lab.data import metric_names as M
from comlrl_lab.data.datasets import load_items
from comlrl_lab.data.formatters import resolve_formatters
from comlrl_lab.data.phases import check_next_phase
from comlrl_lab.data.records import JointCandidate, PreferencePair
from comlrl_lab.data.run_ids import new_run_id
from comlrl_lab.models.chat import chat_formatters
from comlrl_lab.models.generation import SamplingSettings
from comlrl_lab.models.loading import load_agents
from comlrl_lab.models.lora import (
    LoraSettings,
    apply_lora,
    load_trainable_state_dict,
    trainable_parameters,
    trainable_state_dict,
)
from comlrl_lab.models.scoring import disable_dropout
from comlrl_lab.seeding import RandomStreams
from comlrl_lab.trainers.preference import checkpoint as ckpt
from comlrl_lab.trainers.preference.collection import (
    agent_prompts,
    reward_summary,
    sample_joint_candidates,
    score_with_task_reward,
)
from comlrl_lab.trainers.preference.comparators.base import encode_text
from comlrl_lab.trainers.preference.comparators.centralized import (
    TaggedCentralizedComparatorAdapter,
    split_completion,
    validate_adapter,
)
from comlrl_lab.trainers.preference.devices import resolve_layout
from comlrl_lab.trainers.preference.distributed import DistContext
from comlrl_lab.trainers.preference.optim import build_adamw
from comlrl_lab.trainers.preference.sink import PHASES, NullSink, PhaseControl, PhaseRecords, RecordSink
from comlrl_lab.trainers.preference.tracking import Trackers

GENERATION_STREAM = "generation"
EVAL_STREAM = "eval"
LORA_INIT_STREAM = "lora_init"


class Collector(Protocol):
    """Makes a round's candidates and pairs (collect), then chooses what the learner trains on (select)."""

    train_pairs: list[PreferencePair]

    def collect(self, records: PhaseRecords) -> None: ...
    def select(self, records: PhaseRecords) -> None: ...
    def after_train(self) -> None: ...
    def end_of_round(self) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Learner(Protocol):
    """Trains the agents on the selected pairs (train phase); ``extra_weights`` is its part of the weights file."""

    def on_pairs_collected(self, pairs: Sequence[PreferencePair]) -> None: ...
    def train(self, pairs: Sequence[PreferencePair], records: PhaseRecords) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def extra_weights(self) -> dict[str, Any]: ...
    def load_extra_weights(self, weights: dict[str, Any]) -> None: ...


class PreferenceTrainerBase:
    """CoMLRL-compatible construction plus the phase machine; a subclass composes a collector and a learner."""

    collector: Collector
    learner: Learner

    config_class: type = object
    algorithm_name = "Preference"
    iterative = False

    def __init__(
        self,
        agent_model: str | None = None,
        agents: Sequence[Any] | None = None,
        num_agents: int = 2,
        tokenizer: Any = None,
        model_config: dict | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        reward_func: Callable[..., Any] | None = None,
        reward_processor: Callable[[float], float] | None = None,
        formatters: Any = None,
        external_transition: Any = None,
        wandb_config: dict | None = None,
        eval_logger: Callable[..., Any] | None = None,
        eval_aggregator: Callable[..., Any] | None = None,
        args: Any = None,
        *,
        centralized_comparator_adapter: Any = None,
        sink: RecordSink | None = None,
        control: PhaseControl | None = None,
        run_id: str | None = None,
    ):
        self.args = args if args is not None else self.config_class()
        if not callable(reward_func):
            raise ValueError("reward_func must be a callable.")
        # Centralized collaboration: one actor writes every role's output in one tagged joint completion.
        self.centralized = self.args.collaboration_mode == "centralized"
        self.num_roles = int(self.args.num_agents) if self.centralized else None
        if self.centralized:
            if agents is not None and len(agents) != 1:
                raise ValueError("Centralized collaboration requires exactly one actor model.")
            if isinstance(tokenizer, (list, tuple)) and len(tokenizer) != 1:
                raise ValueError("Centralized collaboration requires one actor tokenizer.")
            if int(num_agents) != int(self.args.num_agents):
                raise ValueError("num_agents must match args.num_agents (the role count).")
            if isinstance(tokenizer, (list, tuple)):
                tokenizer = tokenizer[0]
        self.reward_func = reward_func
        self.reward_processor = reward_processor
        self.model_config = dict(model_config or {})
        self.wandb_config = wandb_config
        self.eval_logger = eval_logger
        self.eval_aggregator = eval_aggregator
        self.external_transition = external_transition
        self.centralized_comparator_adapter = centralized_comparator_adapter

        count = 1 if self.centralized else (len(agents) if agents is not None else int(num_agents))
        # Differs from CoMLRL: one process there; under torchrun every rank builds the same trainer here, and
        # DistContext says which share of the work is its own. Every device field resolves in one DeviceLayout.
        self.dist = DistContext.from_env()
        self.dist.init_process_group()
        self.devices = resolve_layout(self.args, count, model_config=self.model_config, dist=self.dist)
        self.agent_devices = self.devices.agents
        bundle = load_agents(
            agent_model=agent_model,
            agents=agents,
            num_agents=count,
            tokenizer=tokenizer,
            model_config=self.model_config,
            devices=self.agent_devices,
        )
        self.agents = list(bundle.models)
        self.tokenizers = list(bundle.tokenizers)
        self.agent_sources = list(bundle.sources)
        self.num_agents = len(self.agents)
        if self.centralized:
            self.central_adapter = validate_adapter(
                centralized_comparator_adapter or TaggedCentralizedComparatorAdapter()
            )
            self.role_formatters = resolve_formatters(formatters, self.num_roles)
            self.formatters = [self._centralized_prompt]
        else:
            self.formatters = resolve_formatters(formatters, self.num_agents)
        # Differs from CoMLRL: raw prompts there; use_chat_template (ours, default auto) renders them through an
        # instruction-tuned model's chat template, and that agent's responses end at its end-of-turn token.
        self.formatters = chat_formatters(
            self.formatters, self.agents, self.tokenizers, self.args.use_chat_template, self.agent_sources
        )
        self.train_items: list[dict] = load_items(train_dataset) if train_dataset is not None else []
        # An empty eval set means "no evaluation" (CoMLRL returns {}), not an error.
        has_eval = eval_dataset is not None and not (hasattr(eval_dataset, "__len__") and len(eval_dataset) == 0)
        self.eval_items: list[dict] = load_items(eval_dataset) if has_eval else []

        self.streams = RandomStreams(self.args.seed, cuda_offset=self.devices.cuda_offset)
        self._prepare_agents()
        # Differs from CoMLRL: a fused AdamW by default (adamw_implementation), the same update rounded differently.
        self.optimizers = [
            build_adamw(trainable_parameters(model), self.args.agent_learning_rate, self.args.adamw_implementation)
            for model in self.agents
        ]
        # Only the main rank commits records; the others compute the same phases and keep nothing.
        self.sink: RecordSink = sink if sink is not None and self.dist.is_main else NullSink()
        self.control = control if control is not None else PhaseControl()
        self.run_id = self.dist.broadcast_object(run_id or new_run_id(digits=6))
        self.output_dir = Path(self.args.output_dir) if self.args.output_dir else Path("runs") / self.run_id
        # Differs from CoMLRL: W&B only there (when wandb_config is given); report_to adds TensorBoard.
        self.trackers = Trackers.build(
            self.args.report_to,
            wandb_config,
            output_dir=self.output_dir,
            run_id=self.run_id,
            config=self.args,
            is_main=self.dist.is_main,
        )
        self.checkpoint_dir: Path | None = None

        # Cursor: the next phase to run. Rounds are 1-based, as the replay files are.
        self.round_index = 1
        self.phase_index = 0
        self.finished = False
        self.updates_seen = 0
        self.env_step = 0
        # Version 0 is the weights as built, which a rebuilt trainer holds again: nothing to write until training.
        self.weights_version = ckpt.INITIAL_WEIGHTS
        self._weights_dirty = False
        self._weights_touched = False  # a train phase has started, so the weights may differ from version 0
        self._writer = ckpt.BackgroundWriter()
        self._weights_from: Path | None = None  # the checkpoint last loaded, until the next save
        # Differs from CoMLRL: it prunes with train(checkpoint_total_limit) only; save_total_limit is TRL's name.
        self.save_total_limit: int | None = self.args.save_total_limit
        self.last_message: str | None = None
        self.history: list[dict[str, Any]] = []  # one summary per finished phase
        # The scored samples of the latest evaluation, in item order (item_index, completions, reward).
        self.last_eval_candidates: list[JointCandidate] = []

    def _prepare_agents(self) -> None:
        """LoRA adapters and gradient checkpointing when asked for; every rank starts from rank 0's weights."""
        # Differs from CoMLRL: it trains every weight and has neither LoRA nor gradient checkpointing.
        if self.args.lora_r is not None:
            settings = LoraSettings(
                r=self.args.lora_r,
                alpha=self.args.lora_alpha,
                dropout=self.args.lora_dropout,
                target_modules=self.args.lora_target_modules,
            )
            self.agents = [
                apply_lora(model, settings, seed=self.streams.stream_seed(f"{LORA_INIT_STREAM}/{i}"))
                for i, model in enumerate(self.agents)
            ]
        if self.args.gradient_checkpointing:
            for model in self.agents:
                # Non-reentrant checkpointing needs no input gradients, so frozen embeddings (LoRA) are fine.
                if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 names it so
                    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
                else:
                    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                if self.args.disable_dropout:
                    # Checkpointing only acts in train mode, so updates run in train mode with dropout at zero.
                    disable_dropout(model)
        # What is trained must start equal on every rank (a LoRA adapter's frozen base comes from the same files).
        for model in self.agents:
            self.dist.broadcast_parameters(trainable_parameters(model))

    @property
    def train_mode_for_updates(self) -> bool:
        """The mode agents score in while learning: train mode only when dropout is wanted or checkpointing needs it."""
        return (not self.args.disable_dropout) or bool(self.args.gradient_checkpointing)

    def row_seeds(
        self, purpose: str, item_indices: Sequence[int], agent: int, *, per_round: bool = True
    ) -> list[int] | None:
        """One sampling seed per item for ``purpose`` in this round, or None when sampling is stream-based.

        Seeds are named after (purpose, round, item, agent), never after a batch or a rank, so the tokens a row
        gets are the same whatever the batching, the sharding across ranks, or a resume in between. With
        ``per_round=False`` the round is left out of the name: every round draws the same numbers (evaluation's
        common random numbers).
        """
        # Differs from CoMLRL: one global, unseeded stream there; per-row seeds here (batch_invariant_sampling).
        if not self.args.batch_invariant_sampling:
            return None
        scope = f"{purpose}/{self.round_index}" if per_round else purpose
        return [self.streams.stream_seed(f"sample/{scope}/{int(k)}/{agent}") for k in item_indices]

    # ---------------------------------------------------------------------------------------------------
    # Settings derived from the config
    @property
    def num_rounds(self) -> int:
        return int(getattr(self.args, "num_iterations", 1)) if self.iterative else 1

    def sampling_settings(self, **overrides: Any) -> SamplingSettings:
        values = dict(
            max_new_tokens=self.args.max_new_tokens,
            temperature=self.args.temperature,
            top_p=self.args.top_p,
            top_k=self.args.top_k,
            batch_size=self.args.generation_batch_size,
        )
        values.update(overrides)
        return SamplingSettings(**values)

    def pad_token_id(self, agent: int) -> int:
        tokenizer = self.tokenizers[agent]
        return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def _require_aligned(self) -> None:
        if str(getattr(self.args, "joint_mode", "aligned")).lower() not in ("aligned", "align"):
            raise ValueError(f"{self.algorithm_name} preference generation currently supports aligned joint_mode only.")

    # ---------------------------------------------------------------------------------------------------
    # Stepping
    @property
    def next_phase(self) -> str | None:
        return None if self.finished else PHASES[self.phase_index]

    def step(self, phase: str | None = None) -> PhaseRecords | None:
        """Run the next phase, commit its records, checkpoint, and advance the cursor. None when finished.

        With ``phase``, raise ``InvalidTransition`` (and run nothing) unless it is the next phase.
        """
        if self.finished:
            return None
        if phase is not None:
            check_next_phase(phase, self.round_index, self.next_phase)
        phase = PHASES[self.phase_index]
        records = PhaseRecords(round_index=self.round_index, phase=phase)
        started = time.monotonic()
        self._run_phase(phase, records)
        records.add_metrics(self.updates_seen, {M.name(M.PHASE_SECONDS, phase=phase): time.monotonic() - started})
        self.sink.commit_phase(records)
        self.trackers.log_phase(records)
        self.history.append({"round": self.round_index, "phase": phase, "seconds": time.monotonic() - started})
        self._advance_cursor()
        if self.finished:
            self.trackers.finish()
        if self.checkpoint_dir is not None and self._saves_after(phase):
            where = (records.round_index, phase, self.updates_seen)

            def report(cost: dict[str, float]) -> None:
                # The phase is committed before its checkpoint (a kill in between redoes the phase), so the cost
                # is added to its records afterwards, from the writer thread when the write is in the background.
                self.sink.add_phase_metrics(*where, {M.name(name, phase=phase): v for name, v in cost.items()})

            self._write_checkpoint(self.checkpoint_dir, report)
        return records

    def _saves_after(self, phase: str) -> bool:
        """Whether ``save_strategy`` checkpoints after ``phase``: every phase, each round's last one, or never."""
        # Differs from CoMLRL: its checkpoints follow checkpoint_interval alone; save_strategy is ours (TRL's name).
        strategy = self.args.save_strategy
        return strategy == "phase" or (strategy == "round" and (phase == PHASES[-1] or self.finished))

    def _run_phase(self, phase: str, records: PhaseRecords) -> None:
        if phase == "collect":
            self.collector.collect(records)
            self.learner.on_pairs_collected(self.collector.round_pairs)
        elif phase == "select":
            self.collector.select(records)
        elif phase == "train":
            self._weights_touched = True
            self.learner.train(self.collector.train_pairs, records)
            self.collector.after_train()
        else:
            self._phase_evaluate(records)

    def _advance_cursor(self) -> None:
        self.phase_index += 1
        if self.phase_index == len(PHASES):
            self.phase_index = 0
            self.round_index += 1
            self.collector.end_of_round()
            if self.round_index > self.num_rounds:
                self.finished = True

    def mark_weights_changed(self) -> None:
        """The agents were updated: the next checkpoint writes their weights again."""
        self._weights_dirty = True

    def train(
        self,
        resume_from_checkpoint: str | Path | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: int | None = None,
        **generation_kwargs: Any,
    ) -> None:
        """Run every remaining phase. CoMLRL's signature; checkpoints are written after each phase when a
        ``checkpoint_dir`` is given (or resumed from)."""
        if isinstance(checkpoint_interval, bool) or not isinstance(checkpoint_interval, int) or checkpoint_interval < 1:
            raise ValueError("checkpoint_interval must be a positive integer.")
        if checkpoint_total_limit is not None:
            limit = checkpoint_total_limit
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ValueError("checkpoint_total_limit must be a positive integer or None.")
            self.save_total_limit = limit  # for this trainer from now on, as the config field would
        generation_kwargs.pop("do_sample", None)
        self.generation_kwargs = generation_kwargs
        if resume_from_checkpoint is not None:
            self.load_checkpoint(resume_from_checkpoint)
            checkpoint_dir = checkpoint_dir or ckpt.checkpoint_root(resume_from_checkpoint)
        if checkpoint_dir is not None:
            self.checkpoint_dir = Path(checkpoint_dir)
        while not self.finished:
            self.step()
        self.wait_for_checkpoint()

    # ---------------------------------------------------------------------------------------------------
    # Collection helpers shared by subclasses
    def collect_current(
        self, items: Sequence[dict], item_indices: Sequence[int], num_candidates: int
    ) -> list[list[JointCandidate]]:
        self._require_aligned()
        prompts = agent_prompts(self.formatters, items)
        generators = [self.streams.torch(GENERATION_STREAM, device) for device in self.agent_devices]
        joint = sample_joint_candidates(
            self.agents,
            self.tokenizers,
            prompts,
            item_indices,
            num_candidates,
            self.sampling_settings(),
            generators,
            side="current",
            on_agent_done=lambda agent, tokens: self.control.advance(len(items), tokens),
            row_seeds=[self.row_seeds("current", item_indices, i) for i in range(self.num_agents)],
            devices=self.agent_devices,
            concurrent_cpu=self.args.concurrent_cpu_agents,
        )
        return joint

    def gather_rows(self, rows: list[list[JointCandidate]]) -> list[list[JointCandidate]]:
        """Every rank's per-item rows (for its ``dist.shard`` of the items), on every rank, in item order."""
        return self.dist.gather_shards(rows)

    def score_task(self, candidates: list[JointCandidate], items_by_index: dict[int, dict]) -> None:
        if not self.centralized:
            score_with_task_reward(candidates, items_by_index, self.reward_func, self.reward_processor)
            return
        # The user's reward sees one completion per role, parsed from the joint text; an untagged joint text
        # gives every role "" (CoMLRL's centralized-collaboration behaviour), so it scores, usually low.
        roles = [self.role_view(c, items_by_index[c.item_index]) for c in candidates]
        score_with_task_reward(roles, items_by_index, self.reward_func, self.reward_processor)
        for candidate, role in zip(candidates, roles):
            candidate.raw_reward, candidate.reward = role.raw_reward, role.reward

    def _centralized_prompt(self, item: dict) -> str:
        return self.central_adapter.build_prompt(item, [fmt(item) for fmt in self.role_formatters])

    def role_view(self, candidate: JointCandidate, item: dict) -> JointCandidate:
        """A centralized candidate as the roles see it: one parsed completion and one role prompt per role."""
        texts = split_completion(self.central_adapter, candidate.completions[0], item, self.num_roles)
        return JointCandidate(
            item_index=candidate.item_index,
            candidate_index=candidate.candidate_index,
            side=candidate.side,
            prompts=[fmt(item) for fmt in self.role_formatters],
            completions=texts if texts is not None else [""] * self.num_roles,
            completion_ids=[],
            prompt_ids=[],
            parse_status=candidate.parse_status,
        )

    def ensure_token_ids(self, pair: PreferencePair) -> PreferencePair:
        """Pairs imported from text get token ids from each agent's tokenizer (sampled pairs already have them)."""
        if pair.has_token_ids:
            return pair
        pair.prompt_ids = [list(self.tokenizers[i](pair.prompts[i])["input_ids"]) for i in range(self.num_agents)]
        pair.winner_ids = [encode_text(self.tokenizers[i], pair.winner_completions[i]) for i in range(self.num_agents)]
        pair.loser_ids = [encode_text(self.tokenizers[i], pair.loser_completions[i]) for i in range(self.num_agents)]
        return pair

    # ---------------------------------------------------------------------------------------------------
    # Evaluation: always the task reward of fresh samples from the current policy.
    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        if not self.eval_items:
            return {}
        count = self.args.eval_num_samples if num_eval_samples is None else int(num_eval_samples)
        items = self.eval_items[: max(0, count)]
        if not items:
            return {}
        # Each rank samples and scores its share of the items; everyone then holds all of them, in order.
        indices = self.dist.shard(list(range(len(items))))
        local_items = [items[k] for k in indices]
        prompts = agent_prompts(self.formatters, local_items)
        generators = [self.streams.torch(EVAL_STREAM, device) for device in self.agent_devices]
        # Differs from CoMLRL: one response per item there; eval_samples_per_item (ours, default 1) draws k, each
        # from its own per-row seed, so response j of an item is the same draw whatever k is.
        per_item = int(self.args.eval_samples_per_item)
        joint = sample_joint_candidates(
            self.agents,
            self.tokenizers,
            prompts,
            indices,
            per_item,
            self.sampling_settings(),
            generators,
            side="current",
            on_agent_done=lambda agent, tokens: self.control.advance(len(local_items) * per_item, tokens),
            # Differs from CoMLRL: the same prompts and sampling seeds every round (common random numbers), so a
            # change from one round's evaluation to the next is the policy's, not the sampler's.
            row_seeds=[self.row_seeds("eval", indices, i, per_round=False) for i in range(self.num_agents)],
            devices=self.agent_devices,
            concurrent_cpu=self.args.concurrent_cpu_agents,
        )
        local = [candidate for row in joint for candidate in row]
        self.score_task(local, dict(zip(indices, local_items)))
        flat = [candidate for row in self.gather_rows(joint) for candidate in row]
        # With several samples per item the eval set is held fixed: the error is the sampling's alone.
        reward, sem, count = reward_summary(flat, stratified=per_item > 1)
        metrics = {
            M.EVAL_REWARD_MEAN: reward,
            M.EVAL_EXPECTED_RETURN: reward,
            M.EVAL_REWARD_SEM: sem,
            M.EVAL_NUM_SAMPLES: count,
        }
        if self.eval_logger is not None and self.eval_aggregator is not None:
            # CoMLRL's shapes: completions per agent (per role when centralized, parsed from the joint text), per
            # sample, per turn; prompts are the items' "prompt" fields, one string per item.
            views = [self.role_view(c, items[c.item_index]) for c in flat] if self.centralized else flat
            logged = self.eval_logger(
                agent_completions_turns=[[[v.completions[i]] for v in views] for i in range(len(views[0].completions))],
                batch_items=[items[c.item_index] for c in flat],
                prompts=[items[c.item_index].get("prompt", "") for c in flat],
            )
            extra = self.eval_aggregator(logged, num_turns=1) or {}
            metrics.update({M.name(M.EVAL_AGGREGATED, key=k): float(v) for k, v in extra.items()})
        self.last_eval_candidates = flat
        return metrics

    def _phase_evaluate(self, records: PhaseRecords) -> None:
        count = min(len(self.eval_items), max(0, int(self.args.eval_num_samples)))
        self.control.begin(self.round_index, "evaluate", count * self.num_agents * int(self.args.eval_samples_per_item))
        if count == 0 or self.args.eval_interval == 0:
            records.add_event("info", "evaluation skipped (no eval_dataset, eval_num_samples=0 or eval_interval=0)")
            return
        metrics = self.evaluate()
        records.add_metrics(self.updates_seen, metrics)
        for candidate in self.last_eval_candidates:
            candidate.side = "eval"
        records.candidates = self.last_eval_candidates

    # ---------------------------------------------------------------------------------------------------
    # Saving
    def save_model(self, output_dir: str | Path) -> None:
        """Each agent and its tokenizer under ``agent_<i>`` (LoRA: the adapter only). Main rank only."""
        if not self.dist.is_main:
            return
        output_dir = Path(output_dir)
        for i, (model, tokenizer) in enumerate(zip(self.agents, self.tokenizers)):
            target = output_dir / f"agent_{i}"
            model.save_pretrained(target)
            tokenizer.save_pretrained(target)

    def _state(self) -> dict[str, Any]:
        """Everything but weights that a resume needs: the cursor, the streams, the collector's and learner's state."""
        return {
            **self.collector.state_dict(),
            **self.learner.state_dict(),
            "trainer": type(self).__name__,
            "run_id": self.run_id,
            "config": self.args.to_dict(),
            "round_index": self.round_index,
            "phase_index": self.phase_index,
            "finished": self.finished,
            "updates_seen": self.updates_seen,
            "env_step": self.env_step,
            "streams": self.streams.state_dict(),
            "num_train_items": len(self.train_items),
        }

    def _load_state(self, state: dict[str, Any]) -> None:
        if state["trainer"] != type(self).__name__:
            raise ValueError(f"checkpoint was written by {state['trainer']}, not {type(self).__name__}")
        self.run_id = state["run_id"]
        self.round_index = int(state["round_index"])
        self.phase_index = int(state["phase_index"])
        self.finished = bool(state["finished"])
        self.updates_seen = int(state["updates_seen"])
        self.env_step = int(state["env_step"])
        self.streams.load_state_dict(state["streams"])
        self.collector.load_state_dict(state)
        self.learner.load_state_dict(state)

    def save_checkpoint(self, directory: str | Path) -> Path:
        # Differs from CoMLRL: it raises after a train() without checkpoint_dir; the state here is always tracked.
        return self._write_checkpoint(directory, None)

    def _write_checkpoint(self, directory: str | Path, report: Callable[[dict[str, float]], None] | None) -> Path:
        """Write (or start writing) a checkpoint; ``report`` gets its cost once it is committed, keyed by the
        ``checkpoint/{phase}_...`` metric templates."""
        started = time.monotonic()
        weights = None
        if self._weights_dirty:
            self.weights_version += 1
            if not self.dist.is_main:  # every rank counts versions; only the main rank writes
                self._weights_dirty = False
                return Path(directory)
            weights = {
                # LoRA: the adapters only; the frozen base is reloaded from its source.
                "agents": [trainable_state_dict(m) for m in self.agents],
                # A finished run trains no more, so a resume never needs the moments (2x the weights for AdamW).
                "optimizers": None if self.finished else [opt.state_dict() for opt in self.optimizers],
                **self.learner.extra_weights(),
            }
        elif not self.dist.is_main:
            return Path(directory)
        options = {"total_limit": self.save_total_limit, "weights_from": self._weights_from}
        # After one save the trainer's weights are in the newest checkpoint, where the next save looks first.
        self._weights_from = None
        if self.args.save_in_background:
            # Copies, since the next phase updates the weights, moments and replay state in place.
            state, weights = copy.deepcopy(self._state()), copy.deepcopy(weights)
            self._writer.wait()  # the write before this one, so that its wait counts as this phase's cost
            blocked = time.monotonic() - started

            def done(written: ckpt.Written, seconds: float) -> None:
                if report is not None:
                    report(
                        {
                            M.CHECKPOINT_SECONDS: blocked,
                            M.CHECKPOINT_BACKGROUND_SECONDS: seconds,
                            M.CHECKPOINT_BYTES: float(written.num_bytes),
                        }
                    )

            self._writer.submit(directory, state, weights, self.weights_version, on_done=done, **options)
            self._weights_dirty = False
            return Path(directory)
        written = ckpt.save_checkpoint(directory, self._state(), weights, self.weights_version, **options)
        self._weights_dirty = False
        if report is not None:
            report({M.CHECKPOINT_SECONDS: time.monotonic() - started, M.CHECKPOINT_BYTES: float(written.num_bytes)})
        return written.path

    def wait_for_checkpoint(self) -> None:
        """Block until a checkpoint being written in the background is on disk; re-raise its error."""
        self._writer.wait()

    def load_checkpoint(self, directory: str | Path) -> None:
        self.wait_for_checkpoint()
        state, weights = ckpt.load_checkpoint(directory)
        # A resume from an older checkpoint than the newest links its unchanged weights from that one.
        self._weights_from = Path(state["checkpoint_path"])
        if weights is None:
            if self._weights_touched:
                raise ckpt.InitialWeightsCheckpoint(
                    f"{directory} holds the initial weights (no train phase had finished); this trainer has trained "
                    "since, so build a fresh trainer to resume from it."
                )
            self.weights_version = ckpt.INITIAL_WEIGHTS
            self._weights_dirty = False
            self._load_state(state)
            return
        for model, device, weights_i in zip(self.agents, self.agent_devices, weights["agents"]):
            load_trainable_state_dict(model, weights_i)
            model.to(device)
        for optimizer, opt_state in zip(self.optimizers, weights["optimizers"] or []):
            optimizer.load_state_dict(opt_state)
        self.learner.load_extra_weights(weights)
        self.weights_version = int(state["weights_version"])
        self._weights_dirty = False
        self._weights_touched = True
        self._load_state(state)

    # ---------------------------------------------------------------------------------------------------
    def log(self, records: PhaseRecords, message: str, level: str = "info") -> None:
        self.last_message = message
        records.add_event(level, message)


def finite_mean(values: Sequence[float]) -> float:
    kept = [float(v) for v in values if not math.isnan(float(v))]
    return sum(kept) / len(kept) if kept else math.nan
