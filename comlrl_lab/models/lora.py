"""LoRA adapters through peft: wrap an agent, train and save only the adapter, share the frozen base.

``apply_lora`` wraps a loaded causal LM with ``peft.get_peft_model`` (adapter weights drawn from a seed, so every
process builds the same adapter); afterwards only the adapter's parameters require gradients. The state helpers
(``trainable_state_dict`` / ``load_trainable_state_dict``) give the adapter weights alone for an adapter model and
the whole state dict otherwise, so checkpoints and policy snapshots of a LoRA run hold adapters only.
``load_adapter_model`` rebuilds base + adapter from a saved adapter directory; ``use_adapter`` runs a block with
a second, frozen adapter (an earlier policy) active on the live model, so a comparator shares the base weights;
``AdapterDisabled`` is the base model seen through the live one (a fixed reference without a copy).

It does not choose devices or dtypes (the caller does) and imports peft only when LoRA is used.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from comlrl_lab.models.devices import model_device
from comlrl_lab.models.loading import LOAD_LOCK, load_model

DEFAULT_ADAPTER = "default"
ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class LoraSettings:
    """peft's ``LoraConfig`` fields we expose; ``target_modules`` None lets peft pick for the architecture."""

    r: int
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: Sequence[str] | str | None = None

    def peft_config(self) -> Any:
        from peft import LoraConfig

        targets = self.target_modules
        if isinstance(targets, (list, tuple)):
            targets = list(targets)
        return LoraConfig(
            r=int(self.r),
            lora_alpha=float(self.alpha),
            lora_dropout=float(self.dropout),
            target_modules=targets,
            task_type="CAUSAL_LM",
        )


def _import_peft() -> Any:
    try:
        import peft
    except ImportError as exc:  # pragma: no cover - depends on what is installed
        raise ImportError("LoRA needs peft: pip install 'comlrl-lab[lora]' (or pip install peft).") from exc
    return peft


@contextlib.contextmanager
def _quiet_peft() -> Iterator[None]:
    """peft asks transformers 5 a deprecated question (``is_gradient_checkpointing``); the answer is the same."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def is_adapter_model(model: Any) -> bool:
    """Whether ``model`` is a peft model (it has adapters)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def lora_forward_model(model: Any) -> Any:
    """The model whose forward a call of ``model`` runs: the transformers model inside a peft LoRA wrapper (peft
    injects the LoRA layers into it, so its forward applies the active adapter, and peft's ``forward`` and
    ``generate`` for LoRA are that model's), else ``model``. Prompt-learning adapters (prefix or prompt tuning) and
    aLoRA add inputs of their own in peft's wrapper, so they keep it."""
    config = getattr(model, "active_peft_config", None) if is_adapter_model(model) else None
    plain_lora = (
        config is not None
        and getattr(config, "peft_type", None) == "LORA"
        and not getattr(config, "is_prompt_learning", False)
        and not getattr(config, "alora_invocation_tokens", None)
    )
    return model.get_base_model() if plain_lora else model


def apply_lora(model: Any, settings: LoraSettings, *, seed: int) -> Any:
    """``model`` wrapped with a fresh LoRA adapter drawn from ``seed``; only adapter weights stay trainable.

    peft draws the adapter's A matrices from the device's global RNG; that draw runs inside a forked RNG seeded
    with ``seed``, so the adapter is reproducible and the global state is left as it was.
    """
    peft = _import_peft()
    device = model_device(model)
    devices = (
        [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    )
    with torch.random.fork_rng(devices=devices), _quiet_peft():
        torch.manual_seed(int(seed))
        wrapped = peft.get_peft_model(model, settings.peft_config())
    return wrapped


def trainable_parameters(model: Any) -> list[torch.nn.Parameter]:
    """The parameters an optimiser should update: those that require gradients (the adapter, under LoRA)."""
    return [p for p in model.parameters() if p.requires_grad]


def trainable_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """What a checkpoint keeps of ``model`` (on the CPU): the adapter weights of an adapter model, else everything."""
    if is_adapter_model(model):
        peft = _import_peft()
        state = peft.get_peft_model_state_dict(model, adapter_name=DEFAULT_ADAPTER)
    else:
        state = model.state_dict()
    return {k: v.detach().cpu() for k, v in state.items()}


def load_trainable_state_dict(model: Any, state: dict[str, torch.Tensor]) -> None:
    """Restore what ``trainable_state_dict`` saved."""
    if is_adapter_model(model):
        peft = _import_peft()
        result = peft.set_peft_model_state_dict(model, state, adapter_name=DEFAULT_ADAPTER)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            raise ValueError(f"adapter checkpoint has keys this model does not: {unexpected[:5]}")
    else:
        model.load_state_dict(state)


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def adapter_base_source(path: str | Path) -> str:
    """The base model an adapter directory was trained on (``base_model_name_or_path`` in its config)."""
    config = json.loads((Path(path) / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    source = config.get("base_model_name_or_path")
    if not source:
        raise ValueError(f"{path}/{ADAPTER_CONFIG} does not name its base model (base_model_name_or_path).")
    return str(source)


def load_adapter_model(
    path: str | Path,
    *,
    device: torch.device | str,
    dtype: Any = None,
    model_kwargs: dict | None = None,
    base_source: str | None = None,
) -> Any:
    """Base model + the adapter saved in ``path``, frozen, on ``device`` (a full copy; see ``use_adapter``)."""
    peft = _import_peft()
    base = load_model(base_source or adapter_base_source(path), device=device, dtype=dtype, model_kwargs=model_kwargs)
    with LOAD_LOCK, _quiet_peft():
        return peft.PeftModel.from_pretrained(base, str(path), is_trainable=False).to(device)


def load_shared_adapter(model: Any, path: str | Path, name: str) -> None:
    """Load the adapter in ``path`` into the live adapter model under ``name`` (replacing one of that name), frozen."""
    if name == DEFAULT_ADAPTER:
        raise ValueError(f"the adapter name {DEFAULT_ADAPTER!r} is the trained one; choose another name")
    if name in model.peft_config:
        model.delete_adapter(name)
    with _quiet_peft():
        model.load_adapter(str(path), adapter_name=name, is_trainable=False)


def drop_shared_adapter(model: Any, name: str) -> None:
    if is_adapter_model(model) and name in model.peft_config:
        model.delete_adapter(name)


@contextlib.contextmanager
def use_adapter(model: Any, name: str) -> Iterator[Any]:
    """Run the block with adapter ``name`` active on ``model``, then make the trained adapter active again.

    peft's ``set_adapter`` marks the active adapter trainable and the others frozen, so switching back restores
    exactly the trainable set the optimiser holds.
    """
    model.set_adapter(name)
    try:
        yield model
    finally:
        model.set_adapter(DEFAULT_ADAPTER)


class AdapterDisabled:
    """The frozen base of a live adapter model, for scoring (``sequence_logps``) without a copy of the weights.

    Calls run the base model with every adapter switched off. ``parameters()`` yields only the frozen base
    weights, so code that freezes "the reference's parameters" cannot freeze the adapter being trained.
    ``eval``/``train``/``to`` leave the live model alone. Use it only while nothing else runs on the model.
    """

    def __init__(self, model: Any):
        if not is_adapter_model(model):
            raise TypeError("AdapterDisabled needs a peft model")
        self.model = model
        self.config = model.get_base_model().config
        self._held = False

    @contextlib.contextmanager
    def held(self) -> Iterator[AdapterDisabled]:
        """Keep the adapters off for every call inside the block, and on again after it.

        peft's switch walks every module of the model (about 0.1 s a switch on SmolLM2-135M), so a scoring pass of
        many micro-batches switches once instead of once per forward. Inside the block the live model is its base:
        it scores as the base, and peft's switch has frozen the adapter's weights too (``parameters()`` then yields
        them, and the live model has nothing to train), so score only the reference there."""
        if self._held:
            yield self
            return
        with self.model.disable_adapter():
            self._held = True
            try:
                yield self
            finally:
                self._held = False

    @property
    def device(self) -> torch.device:
        return model_device(self.model)

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return (p for p in self.model.parameters() if not p.requires_grad)

    def eval(self) -> AdapterDisabled:
        return self

    def train(self, mode: bool = True) -> AdapterDisabled:
        return self

    def to(self, *args: Any, **kwargs: Any) -> AdapterDisabled:
        return self

    def requires_grad_(self, requires_grad: bool = True) -> AdapterDisabled:
        return self

    @property
    def training(self) -> bool:
        return False

    def get_base_model(self) -> Any:
        """The base model class's signature tells scoring which keywords it takes (``scoring.forward_parameters``)."""
        return self.model.get_base_model()

    def forward(self, **kwargs: Any) -> Any:
        if self._held:
            return self.model.get_base_model()(**kwargs)
        with self.model.disable_adapter():
            return self.model.get_base_model()(**kwargs)

    __call__ = forward


def reference_scoring(reference: Any) -> contextlib.AbstractContextManager[Any]:
    """A block in which ``reference`` scores many micro-batches: ``AdapterDisabled.held`` for a LoRA agent's frozen
    base, nothing for a reference of its own."""
    return reference.held() if isinstance(reference, AdapterDisabled) else contextlib.nullcontext(reference)
