"""Turn device and dtype specs from configs into ``torch.device`` lists and ``torch.dtype`` values.

A device spec is what a config field such as ``agent_devices`` holds: ``None`` or ``"auto"``, one device
string for every model, or a list of one or ``count`` devices. This module only resolves specs; it never
moves a model or allocates memory. The number of CUDA devices can be injected, so every layout can be
tested on a CPU-only machine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

AUTO = "auto"

_DTYPE_NAMES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "fp64": torch.float64,
    "float64": torch.float64,
    "double": torch.float64,
}


def _is_auto(spec: Any) -> bool:
    return spec is None or (isinstance(spec, str) and spec.strip().lower() == AUTO)


def _parse_device(value: Any, *, field_name: str, cuda_count: int) -> torch.device:
    if isinstance(value, bool) or not isinstance(value, (str, int, torch.device)):
        raise ValueError(f"{field_name}: each device must be a string such as 'cpu' or 'cuda:1', got {value!r}.")
    try:
        device = torch.device(value.strip() if isinstance(value, str) else value)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"{field_name}: {value!r} is not a valid device ({exc}).") from exc
    if device.type != "cuda":
        return device
    if cuda_count < 1:
        raise ValueError(f"{field_name}: {value!r} asks for CUDA, but no CUDA device is available.")
    # A bare "cuda" means the current CUDA device; giving it an index makes devices comparable by ==.
    index = device.index
    if index is None:
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
    if index >= cuda_count:
        raise ValueError(f"{field_name}: {value!r} asks for CUDA device {index}, but only {cuda_count} are available.")
    return torch.device("cuda", index)


def resolve_devices(
    spec: Any,
    count: int,
    *,
    field_name: str = "agent_devices",
    cuda_count: int | None = None,
) -> list[torch.device]:
    """Resolve ``spec`` into one ``torch.device`` per model (``count`` of them).

    - ``None`` / ``"auto"``: ``cuda:i`` for model i when there are at least ``count`` GPUs; with fewer GPUs
      the models are spread round-robin over the ones there are; with none, ``cpu``.
    - a string (or ``torch.device``): that device for every model.
    - a list or tuple of length 1 (shared) or ``count``.

    Anything else raises ``ValueError`` naming ``field_name``. ``cuda_count`` defaults to
    ``torch.cuda.device_count()``.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"{field_name}: the number of models must be a positive integer, got {count!r}.")
    if cuda_count is None:
        cuda_count = torch.cuda.device_count()

    if _is_auto(spec):
        if cuda_count >= count:
            return [torch.device("cuda", i) for i in range(count)]
        if cuda_count >= 1:
            # Differs from CoMLRL: with fewer GPUs than models, CoMLRL puts every model on cuda:0; we use
            # all GPUs there are, round-robin.
            return [torch.device("cuda", i % cuda_count) for i in range(count)]
        return [torch.device("cpu")] * count

    if isinstance(spec, (str, torch.device)):
        return [_parse_device(spec, field_name=field_name, cuda_count=cuda_count)] * count

    if isinstance(spec, Sequence) and not isinstance(spec, (bytes, bytearray)):
        if len(spec) == 1:
            return [_parse_device(spec[0], field_name=field_name, cuda_count=cuda_count)] * count
        if len(spec) == count:
            return [_parse_device(item, field_name=field_name, cuda_count=cuda_count) for item in spec]
        raise ValueError(
            f"{field_name} must have length 1 or {count} (one device per model), got {len(spec)}: {list(spec)!r}."
        )

    raise ValueError(
        f"{field_name} must be None, 'auto', a device string such as 'cpu' or 'cuda:0', or a list of them; "
        f"got {spec!r}."
    )


def model_device(model: Any) -> torch.device:
    """Where a model takes its inputs (the device of its first parameter when it has no ``device``)."""
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(model.parameters()).device


def bf16_supported(device: torch.device) -> bool:
    """Whether ``device`` runs bfloat16 natively (only CUDA devices are considered)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    with torch.cuda.device(device):
        return bool(torch.cuda.is_bf16_supported())


def resolve_dtype(spec: Any, device: torch.device | str, *, bf16_ok: bool | None = None) -> torch.dtype:
    """Resolve a dtype spec for a model that will live on ``device``.

    ``None`` / ``"auto"``: bfloat16 on a CUDA device that supports it, float32 everywhere else (CPU, older GPUs,
    MPS). Names ("bf16", "bfloat16", "fp16", "float16", "fp32", "float32", ...), "torch.<name>" and
    ``torch.dtype`` values are accepted. ``bf16_ok`` overrides the hardware check (for tests).
    """
    device = torch.device(device)
    if isinstance(spec, torch.dtype):
        return spec
    if _is_auto(spec):
        supported = bf16_supported(device) if bf16_ok is None else bf16_ok
        return torch.bfloat16 if device.type == "cuda" and supported else torch.float32
    if isinstance(spec, str):
        name = spec.strip().lower().removeprefix("torch.")
        if name in _DTYPE_NAMES:
            return _DTYPE_NAMES[name]
    raise ValueError(f"dtype must be 'auto', a torch.dtype or one of {sorted(_DTYPE_NAMES)}, got {spec!r}.")
