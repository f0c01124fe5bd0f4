"""Local comparators: the live actors, a device copy of them, a fixed model, or an earlier policy snapshot."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

from comlrl_lab.models.devices import model_device
from comlrl_lab.models.loading import load_model, load_once
from comlrl_lab.models.lora import (
    drop_shared_adapter,
    is_adapter_dir,
    is_adapter_model,
    load_adapter_model,
    load_shared_adapter,
    use_adapter,
)
from comlrl_lab.trainers.preference.comparators.base import Comparator

INITIAL_SNAPSHOT = "initial"
#: Name of the history snapshot's adapter when it is loaded into the live (LoRA) agent, sharing its base.
HISTORY_ADAPTER = "comparator_history"


def snapshot_name(round_index: int) -> str:
    """Policy snapshot taken after round ``round_index`` (1-based) finished training."""
    return f"iteration_{round_index:04d}"


def frozen(model: Any) -> Any:
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


class CurrentComparator(Comparator):
    """The live actors, sampled under the comparator's own RNG stream."""

    def models_for_round(self) -> list[Any]:
        return self.context.models

    def samples_live_agents(self) -> bool:
        return not self.centralized


class CurrentCopyComparator(Comparator):
    """A frozen copy of the live actors on ``comparator_devices``, refreshed each collection phase.

    When the comparator devices equal the actor devices, a copy would only cost memory, so the live actors
    are used (as in CoMLRL).
    """

    def __init__(self, context):
        super().__init__(context)
        self._copies: list[Any] | None = None

    def _needs_copy(self) -> bool:
        return [str(d) for d in self.context.comparator_devices] != [str(d) for d in self.context.agent_devices]

    def prepare_round(self, round_index: int) -> None:
        if self._needs_copy():
            self._copies = [
                frozen(copy.deepcopy(model).to(device))
                for model, device in zip(self.context.models, self.context.comparator_devices)
            ]

    def release(self) -> None:
        self._copies = None

    def models_for_round(self) -> list[Any]:
        return self._copies if self._copies is not None else self.context.models

    def samples_live_agents(self) -> bool:
        return not self.centralized and not self._needs_copy()


class ModelComparator(Comparator):
    """A fixed model per agent (``comparator_model_name`` or ``comparator_agents``), loaded once per run."""

    def __init__(self, context):
        super().__init__(context)
        self._models: list[Any] | None = None
        config = context.config
        sources = context.comparator_agents or config.comparator_agents
        if sources is None:
            sources = [config.comparator_model_name] * self.num_agents
        elif len(sources) == 1:
            sources = list(sources) * self.num_agents
        if len(sources) != self.num_agents:
            raise ValueError("comparator_agents must have one entry per agent.")
        self.sources = list(sources)

    def models_for_round(self) -> list[Any]:
        if self._models is None:
            model_kwargs = (self.context.model_config or {}).get("model_kwargs")

            def load(source: str, device: Any) -> Any:
                if is_adapter_dir(source):
                    return load_adapter_model(
                        source, device=device, dtype=self.context.dtype, model_kwargs=model_kwargs
                    )
                return load_model(source, device=device, dtype=self.context.dtype, model_kwargs=model_kwargs)

            devices = self.context.comparator_devices
            # One comparator model named for every agent is read once and copied (load_once).
            models = load_once(self.sources, devices, load)
            self._models = [frozen(model.to(device)) for model, device in zip(models, devices)]
        return self._models


class HistoryComparator(Comparator):
    """The actors as they were ``comparator_history_k`` rounds back, from the snapshots the trainer saves.

    Snapshot ``iteration_t`` holds the weights after round t, i.e. the live weights at the start of round t+1,
    so k = 1 compares against the current policy (CoMLRL's semantics). When round ν-k has no snapshot the
    newest one before it is used, and ``initial`` when there is none. Loaded once per round, not per prompt.

    A LoRA run's snapshots are adapters. When the comparator device is the agent's, the adapter is loaded into
    the live agent under its own name and switched on only while the comparator samples, so the base weights
    are shared; elsewhere base + adapter are loaded as a separate model.
    """

    def __init__(self, context):
        super().__init__(context)
        self.k = context.config.comparator_history_k
        self._loaded_from: Path | None = None
        self._models: list[Any] | None = None
        self._shared: set[int] = set()  # agents whose snapshot adapter sits in the live model

    def snapshot_for_round(self, round_index: int) -> Path:
        root = Path(self.context.history_dir)
        target = round_index - self.k
        for t in range(target, 0, -1):
            candidate = root / snapshot_name(t)
            if candidate.is_dir():
                return candidate
        return root / INITIAL_SNAPSHOT

    def prepare_round(self, round_index: int) -> None:
        path = self.snapshot_for_round(round_index)
        if path == self._loaded_from and self._models is not None:
            return
        if not path.is_dir():
            raise FileNotFoundError(f"history comparator: policy snapshot {path} does not exist")
        self._models = [
            self._load_agent(i, path / f"agent_{i}", device) for i, device in enumerate(self.context.comparator_devices)
        ]
        self._loaded_from = path

    def _load_agent(self, i: int, directory: Path, device: Any) -> Any:
        model_kwargs = (self.context.model_config or {}).get("model_kwargs")
        if not is_adapter_dir(directory):
            return frozen(
                load_model(str(directory), device=device, dtype=self.context.dtype, model_kwargs=model_kwargs)
            )
        live = self.context.models[i]
        if is_adapter_model(live) and str(model_device(live)) == str(device):
            load_shared_adapter(live, directory, HISTORY_ADAPTER)
            self._shared.add(i)
            return live
        return frozen(load_adapter_model(directory, device=device, dtype=self.context.dtype, model_kwargs=model_kwargs))

    def sampling_context(self, agent: int):
        if agent in self._shared:
            return use_adapter(self.context.models[agent], HISTORY_ADAPTER)
        return contextlib.nullcontext()

    def release(self) -> None:
        # Keep the loaded snapshot: the next round often needs the same one only when k > 1; reload cost is small
        # compared to holding two copies, so free it.
        for i in self._shared:
            drop_shared_adapter(self.context.models[i], HISTORY_ADAPTER)
        self._shared = set()
        self._models = None
        self._loaded_from = None

    def models_for_round(self) -> list[Any]:
        if self._models is None:
            raise RuntimeError("history comparator used before prepare_round()")
        return self._models
