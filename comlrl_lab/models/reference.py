"""Frozen reference policies: a copy of an agent as it is now, or its frozen base when it trains LoRA adapters.

Both MARLHF's reference KL and MADPO's ``madpo_reference="initial"`` score against such a reference. It only
builds the reference; it does not score or train.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from comlrl_lab.models.lora import AdapterDisabled, is_adapter_model


def frozen_references(agents: Sequence[Any], agent_devices: Sequence[Any], devices: Sequence[Any]) -> list[Any]:
    """One frozen reference per agent, on ``devices[i]``, equal to the agent at the time of the call.

    A LoRA agent whose reference shares its device gets ``AdapterDisabled`` (its frozen base seen through the
    live model: no copy of the weights, and the base never trains). Any other agent gets a deep copy in eval
    mode with every parameter frozen.
    """
    references = []
    for agent, agent_device, device in zip(agents, agent_devices, devices):
        if is_adapter_model(agent) and str(agent_device) == str(device):
            references.append(AdapterDisabled(agent))
            continue
        reference = copy.deepcopy(agent).to(device).eval()
        for parameter in reference.parameters():
            parameter.requires_grad_(False)
        references.append(reference)
    return references
