"""Every device field of a preference config resolved in one place, with its dtype: the run's ``DeviceLayout``.

The fields and their fallbacks (the one table; trainers, comparators and policy learning read the layout and
never resolve a field themselves):

=====================  ======================  =====================================================
role                   config field            None / "auto" means
=====================  ======================  =====================================================
agents                 ``agent_devices``        cuda:i per agent over the GPUs there are, else cpu
comparator             ``comparator_devices``   the agent devices
current_copy           ``comparator_devices``   where the ``current_copy`` comparator keeps its copies
reference              ``reference_devices``    the agent devices
reward_model           ``reward_model_device``  the first agent device (CoMLRL: "cuda:0")
critics                ``critic_devices``       the agent devices
=====================  ======================  =====================================================

Under torchrun each rank owns a slice of its node's GPUs (``DistContext.cuda_slice``) and device indices in the
fields count within that slice: ``cuda:0`` is the rank's first GPU. The same spec therefore runs with any
number of ranks, and "auto" spreads each rank's agents over its own GPUs. The dtype of every model is
``model_config["dtype"]`` (or ``torch_dtype``) resolved for its device: bf16 on a CUDA device that has it,
float32 elsewhere, when the config says nothing. The CUDA device count and bf16 support can be injected, so
every layout is testable on a CPU-only machine. This module does not move or load models.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from comlrl_lab.models.devices import resolve_devices, resolve_dtype
from comlrl_lab.trainers.preference.runtime.distributed import DistContext

ROLES = ("agents", "comparator", "current_copy", "reference", "reward_model", "critics")


@dataclass(frozen=True)
class DeviceLayout:
    """One device (and dtype) per model of every role; ``reward_model`` is a one-element list."""

    agents: list[torch.device]
    comparator: list[torch.device]
    current_copy: list[torch.device]
    reference: list[torch.device]
    reward_model: list[torch.device]
    critics: list[torch.device]
    dtypes: dict[str, list[torch.dtype]] = field(default_factory=dict)
    cuda_offset: int = 0  # the rank's first GPU; device fields count from it

    def as_strings(self) -> dict[str, list[str]]:
        return {role: [str(d) for d in getattr(self, role)] for role in ROLES}


def concurrent_devices(devices: list[torch.device]) -> bool:
    cuda = {str(d) for d in devices if torch.device(d).type == "cuda"}
    return len(cuda) > 1


def model_dtype_spec(model_config: Mapping[str, Any] | None) -> Any:
    config = dict(model_config or {})
    return config.get("dtype", config.get("torch_dtype"))


def resolve_layout(
    config: Any,
    num_agents: int,
    *,
    model_config: Mapping[str, Any] | None = None,
    cuda_count: int | None = None,
    dist: DistContext | None = None,
    bf16_ok: bool | None = None,
) -> DeviceLayout:
    """Resolve every device field of ``config`` (any of the four configs; missing fields count as None).

    ``cuda_count`` defaults to ``torch.cuda.device_count()``; ``dist`` to this process's ``DistContext``;
    ``bf16_ok`` overrides the hardware check of bf16 support (tests).
    """
    if cuda_count is None:
        cuda_count = torch.cuda.device_count()
    dist = DistContext.from_env() if dist is None else dist
    offset, owned = dist.cuda_slice(cuda_count) if dist.enabled else (0, cuda_count)

    def resolve(name: str, count: int, fallback: list[torch.device] | None) -> list[torch.device]:
        spec = getattr(config, name, None)
        if spec is None and fallback is not None:
            return list(fallback)
        if dist.enabled:
            spec = _bare_cuda_is_first(spec)
        local = resolve_devices(spec, count, field_name=name, cuda_count=owned)
        return [_shift(d, offset) for d in local]

    agents = resolve("agent_devices", num_agents, None)
    comparator = resolve("comparator_devices", num_agents, agents)
    reference = resolve("reference_devices", num_agents, agents)
    reward_model = resolve("reward_model_device", 1, agents[:1])
    critics = resolve("critic_devices", num_agents, agents)
    roles = {
        "agents": agents,
        "comparator": comparator,
        "current_copy": list(comparator),
        "reference": reference,
        "reward_model": reward_model,
        "critics": critics,
    }
    dtype_spec = model_dtype_spec(model_config)
    dtypes = {role: [resolve_dtype(dtype_spec, d, bf16_ok=bf16_ok) for d in devices] for role, devices in roles.items()}
    return DeviceLayout(**roles, dtypes=dtypes, cuda_offset=offset)


def _bare_cuda_is_first(spec: Any) -> Any:
    """Under torchrun a bare "cuda" means the rank's first GPU (index 0 of its slice), not the current device."""
    if isinstance(spec, str) and spec.strip().lower() == "cuda":
        return "cuda:0"
    if isinstance(spec, (list, tuple)):
        return [_bare_cuda_is_first(s) for s in spec]
    return spec


def _shift(device: torch.device, offset: int) -> torch.device:
    if device.type == "cuda" and offset:
        return torch.device("cuda", (device.index or 0) + offset)
    return device
