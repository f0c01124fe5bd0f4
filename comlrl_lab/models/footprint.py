"""What a model is and what training it costs in memory, before it is loaded: for Setup's model picker and warning.

``describe_model`` reads a model's config (any source an agent may name: the embedded model, a registered name, a
folder, a ``.gguf`` file, a cached hub id) and builds the architecture on the meta device, so it counts parameters
exactly without allocating them. ``Footprint`` turns the count into bytes per agent: full fine-tuning holds the
weights, their gradients and AdamW's two float32 moments; LoRA holds the frozen weights plus those three for the
adapters only. ``memory_check`` compares a run's agents with the memory available now. Activations are left out:
they grow with batch size and sequence length, and ``benchmarks/real_model.py`` measures how close the peak comes.
This module neither loads weights nor trains.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Bytes of one AdamW moment (kept in float32 whatever the weights' dtype) times its two moments.
ADAMW_STATE_BYTES = 2 * 4


@dataclass(frozen=True)
class Footprint:
    """One agent's model: its architecture, its parameters and what each way of training it holds in memory."""

    architecture: str
    parameters: int
    dtype_bytes: int
    lora_parameters: int  # the adapters' parameters for the LoRA settings asked for

    @property
    def weights_bytes(self) -> int:
        return self.parameters * self.dtype_bytes

    @property
    def full_fine_tuning_bytes(self) -> int:
        """Weights + gradients (their dtype) + AdamW's moments, for every parameter."""
        return self.parameters * (2 * self.dtype_bytes + ADAMW_STATE_BYTES)

    @property
    def lora_bytes(self) -> int:
        """The frozen weights, plus adapters with their gradients and AdamW's moments."""
        return self.weights_bytes + self.lora_parameters * (2 * self.dtype_bytes + ADAMW_STATE_BYTES)


def _lora_parameters(model: Any, rank: int, target_modules: Any) -> int:
    """r * (in + out) for every linear layer LoRA would adapt (peft's default targets when ``target_modules`` is None)."""
    import torch

    if target_modules is None:
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

        target_modules = TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model.config.model_type, [])
    output = model.get_output_embeddings()
    names = {target_modules} if isinstance(target_modules, str) else set(target_modules)
    total = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module is output:
            continue
        if "all-linear" in names or name.rsplit(".", 1)[-1] in names:
            total += rank * (module.in_features + module.out_features)
    return total


def describe_model(
    source: str, *, dtype: str | None = None, lora_r: int = 8, lora_target_modules: Any = "all-linear"
) -> Footprint:
    """The footprint of the model ``source`` names, from its config alone (no weights are read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from comlrl_lab.models.devices import resolve_dtype
    from comlrl_lab.models.loading import load_pretrained

    config = load_pretrained(AutoConfig.from_pretrained, source, "model config")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    weights_dtype = resolve_dtype(dtype, torch.device("cpu"))
    return Footprint(
        architecture=type(model).__name__,
        parameters=sum(p.numel() for p in model.parameters()),
        dtype_bytes=torch.tensor([], dtype=weights_dtype).element_size(),
        lora_parameters=_lora_parameters(model, lora_r, lora_target_modules),
    )


def available_memory_bytes() -> int | None:
    """The memory the kernel says new work can use now (``MemAvailable``), or None where it does not say."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


#: Room left for activations, the tokenizer, Python and the libraries: a run is said to fit when its agents' bytes
#: times this stay under the available memory (the measured peak was within this of weights + grads + AdamW).
HEADROOM = 1.3


def memory_check(agents: list[Footprint], *, lora: bool, available: int | None = None) -> str | None:
    """None when the agents (one footprint each) fit in memory; otherwise a one-line warning saying by how much not."""
    available = available_memory_bytes() if available is None else available
    if available is None or not agents:
        return None
    needed = int(sum(a.lora_bytes if lora else a.full_fine_tuning_bytes for a in agents) * HEADROOM)
    if needed <= available:
        return None
    how = "with LoRA" if lora else "fully fine-tuned"
    with_lora = sum(a.lora_bytes for a in agents) * HEADROOM
    advice = "" if lora else f"; with LoRA (lora_r) they would need about {_gib(with_lora)}"
    sizes = ", ".join(sorted({f"{a.parameters / 1e6:.1f}M" for a in agents}))
    return (
        f"{len(agents)} agents ({sizes} parameters) {how} need about {_gib(needed)} of memory and "
        f"{_gib(available)} is available{advice}"
    )


def _gib(count: float) -> str:
    return f"{count / 2**30:.1f} GiB"
