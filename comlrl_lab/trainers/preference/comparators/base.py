"""The comparator interface and the shared machinery: which models, which RNG stream, centralized parsing."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comlrl_lab.data.records import PARSE_UNPARSED, JointCandidate, align_joint
from comlrl_lab.models.generation import SamplingSettings, sample_candidates
from comlrl_lab.seeding import RandomStreams
from comlrl_lab.trainers.preference.comparators.centralized import split_completion
from comlrl_lab.trainers.preference.runtime.concurrency import map_agents

COMPARATOR_STREAM = "comparator"


@dataclass
class ComparatorContext:
    """What a comparator may use. Built by the trainer; comparators never reach into the trainer itself."""

    config: Any
    models: list[Any]  # the live actors
    tokenizers: list[Any]
    agent_devices: list[Any]
    comparator_devices: list[Any]
    streams: RandomStreams
    sampling: SamplingSettings
    history_dir: Path
    adapter: Any
    model_config: dict | None = None
    comparator_agents: list[Any] | None = None
    dtype: Any = None
    #: (purpose, item indices, agent) -> one sampling seed per item, or None to sample from the stream.
    row_seeds: Callable[[str, Sequence[int], int], list[int] | None] | None = None
    #: Per agent, the prompt a remote endpoint is sent: the task's own text, not the agents' chat rendering.
    request_formatters: list[Callable[[dict], str]] | None = None


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids for a response that arrived as text (API or centralized), ended with EOS like a sampled one."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
    eos = tokenizer.eos_token_id
    return list(ids) + ([eos] if eos is not None else [])


class Comparator:
    """Base class: subclasses say which models write the comparator side (``models_for_round``)."""

    #: True when the comparator's samples come from models that share the actors' tokenizers.
    local = True

    def __init__(self, context: ComparatorContext):
        self.context = context
        self.num_agents = len(context.tokenizers)
        # With centralized collaboration the actor's own prompt already asks for every role, so the comparator
        # samples that prompt as is and keeps the joint text, like the actor does.
        self.centralized = (
            context.config.comparator_generation_mode == "centralized"
            and context.config.collaboration_mode != "centralized"
        )
        self.central_index = int(getattr(context.config, "comparator_centralized_agent_index", 0) or 0)
        self._central_item_indices: list[int] = []

    # Lifecycle --------------------------------------------------------------------------------------------
    def prepare_round(self, round_index: int) -> None:
        """Load or refresh whatever this round compares against (once per round, never per prompt)."""

    def release(self) -> None:
        """Free per-round copies after the collection phase."""

    def models_for_round(self) -> list[Any]:
        raise NotImplementedError

    def samples_live_agents(self) -> bool:
        """Whether each agent's comparator side is sampled from the live agent itself, as is, with the agents'
        sampling settings: then both sides can be sampled in one pass (``sides_in_one_pass``)."""
        return False

    # Generation -------------------------------------------------------------------------------------------
    def generators(self) -> list[Any]:
        devices = self.context.comparator_devices
        return [self.context.streams.torch(COMPARATOR_STREAM, devices[i]) for i in range(self.num_agents)]

    def row_seeds(self, purpose: str, item_indices: Sequence[int], agent: int) -> list[int] | None:
        """Per-item sampling seeds (batch-invariant sampling), or None to use the comparator's stream."""
        if self.context.row_seeds is None:
            return None
        return self.context.row_seeds(purpose, item_indices, agent)

    def sampling_context(self, agent: int) -> contextlib.AbstractContextManager:
        """Entered around agent ``agent``'s sampling (the history comparator switches to a saved adapter)."""
        return contextlib.nullcontext()

    def generate(
        self, items: Sequence[dict], item_indices: Sequence[int], prompts: list[list[str]], num_candidates: int
    ) -> list[list[JointCandidate]]:
        if self.centralized:
            return self._generate_centralized(items, item_indices, prompts, num_candidates)
        models = self.models_for_round()
        generators = self.generators()

        def sample(i: int):
            with self.sampling_context(i):
                return sample_candidates(
                    models[i],
                    self.context.tokenizers[i],
                    prompts[i],
                    num_candidates,
                    self.context.sampling,
                    generators[i],
                    row_seeds=self.row_seeds("comparator", item_indices, i),
                )

        per_agent = map_agents(sample, self.context.comparator_devices)
        return align_joint(per_agent, prompts, item_indices, side="comparator")

    def centralized_texts(
        self, central_prompts: list[str], items: Sequence[dict], num_candidates: int
    ) -> list[list[str]]:
        models = self.models_for_round()
        index = self.central_index
        with self.sampling_context(index):
            samples = sample_candidates(
                models[index],
                self.context.tokenizers[index],
                central_prompts,
                num_candidates,
                self.context.sampling,
                self.generators()[index],
                row_seeds=self.row_seeds("comparator_centralized", self._central_item_indices, index),
            )
        return [[s.text for s in row] for row in samples]

    def _generate_centralized(self, items, item_indices, prompts, num_candidates) -> list[list[JointCandidate]]:
        adapter = self.context.adapter
        central_prompts = []
        for k, item in enumerate(items):
            prompt = adapter.build_prompt(item, [prompts[i][k] for i in range(self.num_agents)])
            if not isinstance(prompt, str) or not prompt:
                raise ValueError("centralized_comparator_adapter.build_prompt must return a non-empty string.")
            central_prompts.append(prompt)
        self._central_item_indices = list(item_indices)
        texts = self.centralized_texts(central_prompts, items, num_candidates)
        return [
            [
                self._centralized_candidate(
                    items[k], item_indices[k], j, [prompts[i][k] for i in range(self.num_agents)], text
                )
                for j, text in enumerate(row)
            ]
            for k, row in enumerate(texts)
        ]

    def _centralized_candidate(self, item, item_index, j, agent_prompts, text) -> JointCandidate:
        parts = split_completion(self.context.adapter, text, item, self.num_agents)
        if parts is None:
            # Differs from CoMLRL: an untagged output is marked, counted and skipped instead of aborting the run.
            return JointCandidate(
                item_index=int(item_index),
                candidate_index=j,
                side="comparator",
                prompts=list(agent_prompts),
                completions=[text] + [""] * (self.num_agents - 1),
                completion_ids=[[] for _ in range(self.num_agents)],
                prompt_ids=[[] for _ in range(self.num_agents)],
                parse_status=PARSE_UNPARSED,
            )
        return self.text_candidate(item_index, j, agent_prompts, parts)

    def text_candidate(self, item_index: int, j: int, agent_prompts: list[str], texts: list[str]) -> JointCandidate:
        tokenizers = self.context.tokenizers
        return JointCandidate(
            item_index=int(item_index),
            candidate_index=j,
            side="comparator",
            prompts=list(agent_prompts),
            completions=list(texts),
            completion_ids=[encode_text(tokenizers[i], texts[i]) for i in range(self.num_agents)],
            prompt_ids=[list(tokenizers[i](agent_prompts[i])["input_ids"]) for i in range(self.num_agents)],
        )

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None
