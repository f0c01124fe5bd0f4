"""What every preference trainer shares: CoMLRL's constructor, the phase machine, evaluation and checkpoints.

A trainer advances one phase at a time (``step()``): collect -> select -> train -> evaluate, round after
round; a run labelled by people or a judge (``preference_source``) has a label phase after collect, whose
``Labeller`` (``labelling.py``) gathers the verdicts the select phase builds its pairs from. ``train()`` simply steps until done, so the Python API, the CLI and the workbench's background engine all
drive the same code. Each public trainer is a composition: it sets ``self.collector`` (collect and select:
``collectors.py``) and ``self.learner`` (train: ``madpo.DPOLearner`` or ``marlhf.RLHFLearner``); this module owns
the cursor, evaluation, the commit of each phase's records to the sink, and the checkpoint written after it. It
does not know about DuckDB or Streamlit.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from comlrl_lab.data.code_eval import code_eval_metrics
from comlrl_lab.data.datasets import load_items
from comlrl_lab.data.formatters import resolve_formatters
from comlrl_lab.data.labels import Label
from comlrl_lab.data.records import JointCandidate, PreferencePair
from comlrl_lab.models.chat import chat_formatters
from comlrl_lab.models.cpu_matmul import use_onednn_linears
from comlrl_lab.models.generation import sampling_path_lines
from comlrl_lab.models.host_memory import keep_freed_host_memory, release_freed_host_memory
from comlrl_lab.models.loading import load_agents
from comlrl_lab.models.lora import (
    LoraSettings,
    apply_lora,
    load_trainable_state_dict,
    trainable_parameters,
    trainable_state_dict,
)
from comlrl_lab.models.scoring import disable_dropout
from comlrl_lab.names import metric_names as M
from comlrl_lab.names.phases import check_next_phase, round_phases
from comlrl_lab.names.run_ids import new_run_id
from comlrl_lab.seeding import RandomStreams
from comlrl_lab.trainers.preference import round as round_plan
from comlrl_lab.trainers.preference.comparators.centralized import TaggedCentralizedComparatorAdapter, validate_adapter
from comlrl_lab.trainers.preference.comparators.local import ModelComparator
from comlrl_lab.trainers.preference.learning.optim import build_adamw
from comlrl_lab.trainers.preference.rounds.collection import agent_prompts, reward_summary, sample_joint_candidates
from comlrl_lab.trainers.preference.rounds.context import CentralizedRoles, PartContext, Trained
from comlrl_lab.trainers.preference.rounds.labelling import Labeller
from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt
from comlrl_lab.trainers.preference.runtime.devices import DeviceLayout, resolve_layout
from comlrl_lab.trainers.preference.runtime.distributed import DistContext
from comlrl_lab.trainers.preference.runtime.fingerprint import (
    ModelMismatch,
    differences,
    model_fingerprint,
    nested_tensors,
    tensors_fingerprint,
    tokenizer_fingerprint,
)
from comlrl_lab.trainers.preference.runtime.frozen_heap import frozen_heap
from comlrl_lab.trainers.preference.runtime.sink import NullSink, PhaseControl, PhaseRecords, RecordSink
from comlrl_lab.trainers.preference.runtime.tracking import Trackers

logger = logging.getLogger(__name__)

EVAL_STREAM = "eval"
LORA_INIT_STREAM = "lora_init"


class Collector(Protocol):
    """Makes a round's candidates and pairs (collect), then chooses what the learner trains on (select).

    ``step`` is the trainer's update count, the step its metrics are recorded at; the round is the records'.
    """

    round_pairs: list[PreferencePair]  # what the last collect made (comparisons, in a labelled run)
    train_pairs: list[PreferencePair]  # what the last select chose
    round_labels: list[Label]  # the last label phase's verdicts (a labelled run)
    labelled_pairs: list[PreferencePair]  # the pairs the last select of a labelled run made from them

    def collect(self, records: PhaseRecords, step: int) -> None: ...
    def select(self, records: PhaseRecords, step: int) -> None: ...
    def after_train(self, round_index: int) -> None: ...
    def end_of_round(self) -> None: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class Learner(Protocol):
    """Trains the agents on the selected pairs (train phase); ``extra_weights`` is its part of the weights file."""

    def on_pairs_collected(self, pairs: Sequence[PreferencePair]) -> None: ...
    def train(self, pairs: Sequence[PreferencePair], records: PhaseRecords, step: int) -> Trained: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def extra_weights(self) -> dict[str, Any]: ...
    def load_extra_weights(self, weights: dict[str, Any]) -> None: ...


class _InContext:
    """A trainer attribute that is its ``PartContext``'s field of the same name: one value, read and set in one place."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, trainer: Any, owner: type | None = None) -> Any:
        return self if trainer is None else getattr(trainer.context, self.name)

    def __set__(self, trainer: Any, value: Any) -> None:
        setattr(trainer.context, self.name, value)


class PreferenceTrainerBase:
    """CoMLRL-compatible construction plus the phase machine; a subclass composes a collector and a learner."""

    collector: Collector
    learner: Learner
    context: PartContext
    labeller: Labeller | None  # preference_source human or judge

    config_class: type = object
    algorithm_name = "Preference"
    iterative = False

    # CoMLRL's attribute names for what the collector and learner see through the context.
    agents = _InContext()
    tokenizers = _InContext()
    optimizers = _InContext()
    formatters = _InContext()
    devices = _InContext()
    model_config = _InContext()
    agent_sources = _InContext()
    train_items = _InContext()
    reward_func = _InContext()
    reward_processor = _InContext()
    streams = _InContext()
    dist = _InContext()
    control = _InContext()
    output_dir = _InContext()
    run_id = _InContext()

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
        tokenizer = self._actor_tokenizer(agents, tokenizer, num_agents)  # CoMLRL's order: the actor count first
        if not callable(reward_func):
            raise ValueError("reward_func must be a callable.")
        self.wandb_config = wandb_config
        self.eval_logger = eval_logger
        self.eval_aggregator = eval_aggregator
        self.external_transition = external_transition
        self.centralized_comparator_adapter = centralized_comparator_adapter
        model_config = dict(model_config or {})
        count = 1 if self.centralized else (len(agents) if agents is not None else int(num_agents))
        roles, formatters = self._prompt_formatters(formatters, centralized_comparator_adapter, count)
        train_items, self.eval_items = _task_items(train_dataset, eval_dataset)
        if roles is not None:
            _refuse_empty_joint_prompts(roles, train_items, self.eval_items)
        dist, devices = self._place(count, model_config)
        bundle = load_agents(
            agent_model=agent_model,
            agents=agents,
            num_agents=count,
            tokenizer=tokenizer,
            model_config=model_config,
            devices=devices.agents,
        )
        # Differs from CoMLRL: raw prompts there; use_chat_template (ours, default auto) renders them through an
        # instruction-tuned model's chat template, and that agent's responses end at its end-of-turn token.
        formatters = chat_formatters(
            formatters, list(bundle.models), list(bundle.tokenizers), self.args.use_chat_template, list(bundle.sources)
        )
        streams = RandomStreams(self.args.seed, cuda_offset=devices.cuda_offset)
        models = self._prepare_agents(list(bundle.models), streams, dist, devices.agents)
        # Differs from CoMLRL: a fused AdamW by default (adamw_implementation), the same update rounded differently.
        optimizers = [
            build_adamw(trainable_parameters(model), self.args.agent_learning_rate, self.args.adamw_implementation)
            for model in models
        ]
        run_id = dist.broadcast_object(run_id or new_run_id(digits=6))
        self.context = PartContext(
            config=self.args,
            algorithm_name=self.algorithm_name,
            agents=models,
            tokenizers=list(bundle.tokenizers),
            optimizers=optimizers,
            formatters=formatters,
            devices=devices,
            model_config=model_config,
            agent_sources=list(bundle.sources),
            train_items=train_items,
            reward_func=reward_func,
            reward_processor=reward_processor,
            roles=roles,
            streams=streams,
            dist=dist,
            control=control if control is not None else PhaseControl(),
            output_dir=Path(self.args.output_dir) if self.args.output_dir else Path("runs") / run_id,
            run_id=run_id,
        )
        self._open_outputs(sink)
        self.phases = round_phases(self.args.preference_source)
        self.labeller = None if self.args.preference_source == "reward" else Labeller(self.context, self.sink.labels)
        self._start_cursor()

    # ---------------------------------------------------------------------------------------------------
    # Construction steps, in the order __init__ takes them
    def _actor_tokenizer(self, agents: Sequence[Any] | None, tokenizer: Any, num_agents: int) -> Any:
        """The tokenizer argument, checked against centralized collaboration: one actor writes every role's
        output in one tagged joint completion, so it takes one model and one tokenizer."""
        if not self.centralized:
            return tokenizer
        if agents is not None and len(agents) != 1:
            raise ValueError("Centralized collaboration requires exactly one actor model.")
        if isinstance(tokenizer, (list, tuple)) and len(tokenizer) != 1:
            raise ValueError("Centralized collaboration requires one actor tokenizer.")
        if int(num_agents) != int(self.args.num_agents):
            raise ValueError("num_agents must match args.num_agents (the role count).")
        return tokenizer[0] if isinstance(tokenizer, (list, tuple)) else tokenizer

    def _place(self, count: int, model_config: dict) -> tuple[DistContext, DeviceLayout]:
        """This process's rank and every model's device and dtype."""
        # Differs from CoMLRL: one process there; under torchrun every rank builds the same trainer here, and
        # DistContext says which share of the work is its own. Every device field resolves in one DeviceLayout.
        dist = DistContext.from_env()
        dist.init_process_group()
        return dist, resolve_layout(self.args, count, model_config=model_config, dist=dist)

    def _prompt_formatters(
        self, formatters: Any, adapter: Any, num_agents: int
    ) -> tuple[CentralizedRoles | None, list[Callable[[dict], str]]]:
        """One prompt formatter per agent; under centralized collaboration the one actor's joint prompt, built
        from one formatter per role."""
        if not self.centralized:
            return None, resolve_formatters(formatters, num_agents)
        roles = CentralizedRoles(
            adapter=validate_adapter(adapter or TaggedCentralizedComparatorAdapter()),
            formatters=resolve_formatters(formatters, int(self.args.num_agents)),
        )
        return roles, [roles.prompt]

    def _prepare_agents(
        self, agents: list[Any], streams: RandomStreams, dist: DistContext, devices: list[Any]
    ) -> list[Any]:
        """LoRA adapters, gradient checkpointing and oneDNN linears when asked for; every rank starts from rank 0's
        weights."""
        # Differs from CoMLRL: it trains every weight and has neither LoRA nor gradient checkpointing.
        if self.args.lora_r is not None:
            settings = LoraSettings(
                r=self.args.lora_r,
                alpha=self.args.lora_alpha,
                dropout=self.args.lora_dropout,
                target_modules=self.args.lora_target_modules,
            )
            agents = [
                apply_lora(model, settings, seed=streams.stream_seed(f"{LORA_INIT_STREAM}/{i}"))
                for i, model in enumerate(agents)
            ]
        if self.args.gradient_checkpointing:
            for model in agents:
                # Non-reentrant checkpointing needs no input gradients, so frozen embeddings (LoRA) are fine.
                if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 names it so
                    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
                else:
                    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
                if self.args.disable_dropout:
                    # Checkpointing only acts in train mode, so updates run in train mode with dropout at zero.
                    disable_dropout(model)
        if self.args.cpu_matmul == "onednn":
            for model, device in zip(agents, devices, strict=True):
                if device.type == "cpu":
                    use_onednn_linears(model)
        # What is trained must start equal on every rank (a LoRA adapter's frozen base comes from the same files).
        for model in agents:
            dist.broadcast_parameters(trainable_parameters(model))
        return agents

    def _open_outputs(self, sink: RecordSink | None) -> None:
        """Where records and tracked metrics go."""
        # Only the main rank commits records; the others compute the same phases and keep nothing.
        self.sink: RecordSink = sink if sink is not None and self.dist.is_main else NullSink()
        # Differs from CoMLRL: W&B only there (when wandb_config is given); report_to adds TensorBoard.
        self.trackers = Trackers.build(
            self.args.report_to,
            self.wandb_config,
            output_dir=self.output_dir,
            run_id=self.run_id,
            config=self.args,
            is_main=self.dist.is_main,
        )

    def _start_cursor(self) -> None:
        """The cursor at the first phase, and the checkpoint bookkeeping of a freshly built trainer."""
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
        self._sampling_paths_logged = False  # the first collect says which path samples each model
        self._writer = ckpt.BackgroundWriter()
        self._weights_from: Path | None = None  # the checkpoint last loaded, until the next save
        self._fingerprints: dict[str, Any] | None = None  # of the run's initial models; see initial_fingerprints()
        # Differs from CoMLRL: it prunes with train(checkpoint_total_limit) only; save_total_limit is TRL's name.
        self.save_total_limit: int | None = self.args.save_total_limit
        self.last_message: str | None = None  # the collector's or learner's latest event, for progress lines
        self.history: list[dict[str, Any]] = []  # one summary per finished phase
        # The scored samples of the latest evaluation, in item order (item_index, completions, reward).
        self.last_eval_candidates: list[JointCandidate] = []

    # ---------------------------------------------------------------------------------------------------
    # Derived from the context and the config
    @property
    def agent_devices(self) -> list[Any]:
        return self.context.agent_devices

    @property
    def num_agents(self) -> int:
        return self.context.num_agents

    @property
    def centralized(self) -> bool:
        """Centralized collaboration: one actor writes every role's output in one tagged joint completion."""
        return self.args.collaboration_mode == "centralized"

    @property
    def num_rounds(self) -> int:
        return int(getattr(self.args, "num_iterations", 1)) if self.iterative else 1

    # ---------------------------------------------------------------------------------------------------
    # Stepping
    @property
    def next_phase(self) -> str | None:
        return None if self.finished else self.phases[self.phase_index]

    def step(self, phase: str | None = None) -> PhaseRecords | None:
        """Run the next phase, commit its records, checkpoint, and advance the cursor. None when finished.

        With ``phase``, raise ``InvalidTransition`` (and run nothing) unless it is the next phase.
        """
        if self.finished:
            return None
        if phase is not None:
            check_next_phase(phase, self.round_index, self.next_phase)
        # Differs from CoMLRL: the garbage collector's full passes skip the objects older than the step.
        with frozen_heap(self.args.gc_freeze_during_steps):
            return self._step(self.phases[self.phase_index])

    def _step(self, phase: str) -> PhaseRecords:
        if self.args.keep_freed_host_memory and any(device.type == "cpu" for device in self.agent_devices):
            # Differs from CoMLRL: malloc left as the process starts it there; here freed blocks are kept for reuse.
            logger.debug("keep_freed_host_memory: %s", keep_freed_host_memory())
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
            release_freed_host_memory()  # a long-lived process (workbench, notebook) keeps no finished run's peak
        if self.checkpoint_dir is not None and self._saves_after(phase):
            self._write_checkpoint(self.checkpoint_dir, (records.round_index, phase, self.updates_seen))
        return records

    def _saves_after(self, phase: str) -> bool:
        """Whether ``save_strategy`` checkpoints after ``phase``: every phase, each round's last one, or never."""
        # Differs from CoMLRL: its checkpoints follow checkpoint_interval alone; save_strategy is ours (TRL's name).
        strategy = self.args.save_strategy
        return strategy == "phase" or (strategy == "round" and (phase == self.phases[-1] or self.finished))

    def _run_phase(self, phase: str, records: PhaseRecords) -> None:
        if phase == "collect":
            self._log_sampling_paths(records)
        round_plan.run_phase(self, phase, records)

    def mark_weights_touched(self) -> None:
        """The agents are about to be trained: a resume can no longer start from the initial weights."""
        self._weights_touched = True

    def count_training(self, trained: Trained) -> None:
        """Add a train phase's updates and environment steps; its weights need saving at the next checkpoint."""
        self.updates_seen += trained.updates
        self.env_step += trained.env_steps
        self._weights_dirty = self._weights_dirty or trained.weights_changed

    def _log_sampling_paths(self, records: PhaseRecords) -> None:
        """Once per trainer, at its first collect: which path samples each agent and model comparator."""
        if self._sampling_paths_logged:
            return
        self._sampling_paths_logged = True
        models = {f"agent {i}": model for i, model in enumerate(self.agents)}
        comparator = getattr(self.collector, "comparator", None)
        if isinstance(comparator, ModelComparator):  # loaded once per run, here a little earlier
            models.update({f"comparator {i}": model for i, model in enumerate(comparator.models_for_round())})
        row_seeded = bool(self.args.batch_invariant_sampling)
        for line in sampling_path_lines(models, self.context.sampling_settings(), row_seeded):
            logger.info(line)
            records.add_event("info", line)

    def _advance_cursor(self) -> None:
        self.phase_index += 1
        if self.phase_index == len(self.phases):
            self.phase_index = 0
            self.round_index += 1
            self.collector.end_of_round()
            if self.round_index > self.num_rounds:
                self.finished = True

    def train(
        self,
        resume_from_checkpoint: str | Path | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_interval: int = 1,
        checkpoint_total_limit: int | None = None,
        *,
        trust_checkpoint: bool = False,
        **generation_kwargs: Any,
    ) -> None:
        """Run every remaining phase. CoMLRL's signature; checkpoints are written after each phase when a
        ``checkpoint_dir`` is given (or resumed from). ``trust_checkpoint`` (ours) lets a resume read a checkpoint
        of format 1, whose state file is a pickle (``runtime/checkpoint.py``)."""
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
            self.load_checkpoint(resume_from_checkpoint, trust_checkpoint=trust_checkpoint)
            checkpoint_dir = checkpoint_dir or ckpt.checkpoint_root(resume_from_checkpoint)
        if checkpoint_dir is not None:
            self.checkpoint_dir = Path(checkpoint_dir)
        with frozen_heap(self.args.gc_freeze_during_steps):  # one freeze for every step, and the gaps between
            while not self.finished:
                self.step()
        self.wait_for_checkpoint()

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
        context = self.context
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
            context.sampling_settings(),
            generators,
            side="current",
            on_agent_done=lambda agent, tokens: self.control.advance(len(local_items) * per_item, tokens),
            # Differs from CoMLRL: the same prompts and sampling seeds every round (common random numbers), so a
            # change from one round's evaluation to the next is the policy's, not the sampler's.
            row_seeds=[context.row_seeds("eval", indices, i, None) for i in range(self.num_agents)],
            devices=self.agent_devices,
            concurrent_cpu=self.args.concurrent_cpu_agents,
        )
        local = [candidate for row in joint for candidate in row]
        context.score_task(local, dict(zip(indices, local_items)))
        flat = [candidate for row in context.gather_rows(joint) for candidate in row]
        # With several samples per item the eval set is held fixed: the error is the sampling's alone.
        reward, sem, count = reward_summary(flat, stratified=per_item > 1)
        metrics = {
            M.EVAL_REWARD_MEAN: reward,
            M.EVAL_EXPECTED_RETURN: reward,
            M.EVAL_REWARD_SEM: sem,
            M.EVAL_NUM_SAMPLES: count,
            # A code task's reward counts tests: pass@1 and the mean level reward, with their 95% CIs.
            **code_eval_metrics(flat, stratified=per_item > 1),
        }
        if self.eval_logger is not None and self.eval_aggregator is not None:
            # CoMLRL's shapes: completions per agent (per role when centralized, parsed from the joint text), per
            # sample, per turn; prompts are the items' "prompt" fields, one string per item.
            roles = context.roles
            views = flat if roles is None else [roles.view(c, items[c.item_index]) for c in flat]
            logged = self.eval_logger(
                agent_completions_turns=[[[v.completions[i]] for v in views] for i in range(len(views[0].completions))],
                batch_items=[items[c.item_index] for c in flat],
                prompts=[items[c.item_index].get("prompt", "") for c in flat],
            )
            extra = self.eval_aggregator(logged, num_turns=1) or {}
            metrics.update({M.name(M.EVAL_AGGREGATED, key=k): float(v) for k, v in extra.items()})
        self.last_eval_candidates = flat
        return metrics

    def evaluate_phase(self, records: PhaseRecords) -> None:
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
            "fingerprints": self.initial_fingerprints(),
        }

    def initial_fingerprints(self) -> dict[str, Any]:
        """Fingerprints of the run's initial models (``fingerprint.py``): taken before the first train phase, or
        adopted from the checkpoint this trainer resumed from."""
        if self._fingerprints is None:
            self._fingerprints = {
                "agents": [model_fingerprint(m) for m in self.agents],
                "tokenizers": [tokenizer_fingerprint(t) for t in self.tokenizers],
                "extras": tensors_fingerprint(nested_tensors(self.learner.extra_weights())),
            }
        return self._fingerprints

    def _check_identity(self, state: dict[str, Any], has_weights: bool, where: str) -> None:
        """Refuse a checkpoint whose run started from other tokenizers, other frozen weights, or (when it holds no
        weights of its own to restore) other initial weights than this trainer's."""
        saved = state.get("fingerprints")
        if not saved:  # format 1: nothing recorded to compare
            return
        found = differences(saved, self.initial_fingerprints())
        # Differs from CoMLRL: it restores whatever weights the checkpoint has and checks nothing; so do we when the
        # checkpoint has them, but a tokenizer, a frozen base or (before the first train phase) initial weights that
        # differ from the run's would silently continue another experiment, so they are refused.
        if "tokenizers" in found:
            raise ModelMismatch(
                f"{where} was written with other tokenizers ({', '.join(found['tokenizers'])}) than this trainer's, "
                "so its stored token ids would mean other words; build the trainer from the run's own models."
            )
        if "frozen" in found:
            raise ModelMismatch(
                f"{where} holds LoRA adapters trained on another base model ({', '.join(found['frozen'])}) than "
                "this trainer's; build the trainer from the run's own models."
            )
        if not has_weights and ("trainable" in found or "extras" in found):
            which = ", ".join(found.get("trainable", []) + found.get("extras", []))
            raise ModelMismatch(
                f"{where} holds no weights yet (no train phase had finished), and this trainer's initial weights "
                f"differ from the run's ({which}): it would continue from other weights. Build the trainer from the "
                "same models and seed as the run, or start a new run."
            )

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

    def _write_checkpoint(self, directory: str | Path, where: tuple[int, str, int] | None) -> Path:
        """Write (or start writing) a checkpoint. After phase ``where`` (round, phase, step), its cost is kept in the
        checkpoint (``cost.json``) and, once it is committed, added to that phase's records (``checkpoint/*``)."""
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
        background = bool(self.args.save_in_background)
        blocked: float | None = None

        def describe(num_bytes: int, seconds: float) -> dict[str, Any]:
            if where is None:
                return {}
            round_index, phase, step = where
            cost = {M.CHECKPOINT_BYTES: float(num_bytes)}
            if background:
                cost.update({M.CHECKPOINT_SECONDS: blocked, M.CHECKPOINT_BACKGROUND_SECONDS: seconds})
            else:
                cost[M.CHECKPOINT_SECONDS] = time.monotonic() - started
            metrics = {M.name(name, phase=phase): value for name, value in cost.items()}
            return {"round": round_index, "phase": phase, "step": step, "metrics": metrics}

        def report(written: ckpt.Written, _seconds: float = 0.0) -> None:
            # The phase is committed before its checkpoint (a kill in between redoes the phase), so the cost is added
            # to its records afterwards, from the writer thread when the write is in the background. A kill between
            # the checkpoint's commit and this call leaves the cost in cost.json, which the engine adds on reopening.
            if written.cost:
                self.sink.add_phase_metrics(*where, written.cost["metrics"])

        options = {"total_limit": self.save_total_limit, "weights_from": self._weights_from, "describe": describe}
        # After one save the trainer's weights are in the newest checkpoint, where the next save looks first.
        self._weights_from = None
        if background:
            # Copies, since the next phase updates the weights, moments and replay state in place.
            state, weights = copy.deepcopy(self._state()), copy.deepcopy(weights)
            self._writer.wait()  # the write before this one, so that its wait counts as this phase's cost
            blocked = time.monotonic() - started
            self._writer.submit(directory, state, weights, self.weights_version, on_done=report, **options)
            self._weights_dirty = False
            return Path(directory)
        written = ckpt.save_checkpoint(directory, self._state(), weights, self.weights_version, **options)
        self._weights_dirty = False
        report(written)
        return written.path

    def wait_for_checkpoint(self) -> None:
        """Block until a checkpoint being written in the background is on disk; re-raise its error."""
        self._writer.wait()

    def load_checkpoint(self, directory: str | Path, *, trust_checkpoint: bool = False) -> None:
        """Resume from the newest checkpoint under ``directory`` (or that checkpoint folder itself).

        Weights the checkpoint holds are restored, as CoMLRL does; a checkpoint from other tokenizers, another frozen
        base, or, before the first train phase, other initial weights is refused (``ModelMismatch``). A checkpoint of
        format 1 (a pickle) is read only with ``trust_checkpoint=True``.
        """
        self.wait_for_checkpoint()
        state, weights = ckpt.load_checkpoint(directory, trust_checkpoint=trust_checkpoint)
        self._check_identity(state, weights is not None, state["checkpoint_path"])
        if state.get("fingerprints"):
            self._fingerprints = state["fingerprints"]  # the run's initial models, recorded by every later checkpoint
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


def _task_items(train_dataset: Any, eval_dataset: Any) -> tuple[list[dict], list[dict]]:
    """The train and eval items, read from whatever CoMLRL accepts (a list, a ``datasets.Dataset``, a file)."""
    train_items = load_items(train_dataset) if train_dataset is not None else []
    # An empty eval set means "no evaluation" (CoMLRL returns {}), not an error.
    has_eval = eval_dataset is not None and not (hasattr(eval_dataset, "__len__") and len(eval_dataset) == 0)
    return train_items, load_items(eval_dataset) if has_eval else []


def _refuse_empty_joint_prompts(roles: CentralizedRoles, train_items: list[dict], eval_items: list[dict]) -> None:
    """Refuse, in one line and before any model is loaded, an item whose centralized joint prompt is empty: the actor
    would have no prompt token to start from (torch's "cannot reshape tensor of 0 elements" deep in sampling)."""
    for name, items in (("train", train_items), ("eval", eval_items)):
        for k, item in enumerate(items):
            prompt = roles.prompt(item)
            if not isinstance(prompt, str) or not prompt.strip():
                shown = repr(item)
                shown = shown if len(shown) <= 80 else shown[:77] + "..."
                raise ValueError(
                    f"collaboration_mode='centralized': the joint prompt of {name} item {k} {shown} is "
                    f"{prompt!r}; centralized_comparator_adapter.build_prompt must return the text the actor answers."
                )


def finite_mean(values: Sequence[float]) -> float:
    kept = [float(v) for v in values if not math.isnan(float(v))]
    return sum(kept) / len(kept) if kept else math.nan
