"""Every device field resolved for CPU-only, one-GPU and four-GPU machines, alone and under torchrun: tables.

Each row of ``LAYOUTS`` is a machine (CUDA devices, this process's rank), a config's device fields and what the
roles resolve to (the roles a row names; the first rows name all six). ``DTYPES`` gives each model's dtype per
device and ``model_config``, ``ERRORS`` the message a bad field gets. Device counts are injected or monkeypatched;
no CUDA device is ever created, so this runs on any CPU host. A new case is a new row.
"""

from __future__ import annotations

import pytest
import torch

from comlrl_lab.trainers.preference import MADPOIterConfig, MARLHFIterConfig
from comlrl_lab.trainers.preference.runtime.devices import ROLES, resolve_layout
from comlrl_lab.trainers.preference.runtime.distributed import DistContext

ONE_RANK = DistContext()
#: Four ranks on two nodes of two GPUs each (a rank's local rank picks its slice), and three ranks on one node.
FOUR_RANKS = [DistContext(rank=r, world_size=4, local_rank=r % 2, local_world_size=2) for r in range(4)]
THREE_RANKS = [DistContext(rank=r, world_size=3, local_rank=r, local_world_size=3) for r in range(3)]


def marlhf(**fields):
    """A MARLHFIter config that has every device role: a reference (KL), a reward model and a critic (maac)."""
    return MARLHFIterConfig(reference_kl_enabled=True, rl_algorithm="maac", **fields)


def madpo(**fields):
    """A MADPOIter config: no MARLHF fields, so the reward model and critics fall back to the agents."""
    return MADPOIterConfig(**fields)


def layout(config, cuda_count, dist=ONE_RANK, model_config=None, bf16_ok=True, num_agents=2):
    return resolve_layout(
        config, num_agents, model_config=model_config, cuda_count=cuda_count, dist=dist, bf16_ok=bf16_ok
    ).as_strings()


def every_role(agents, comparator, reference, reward_model, critics):
    """All six roles; the current_copy comparator sits where the comparator does."""
    return dict(
        agents=agents,
        comparator=comparator,
        current_copy=comparator,
        reference=reference,
        reward_model=reward_model,
        critics=critics,
    )


CPU2, GPU0, GPU01 = ["cpu", "cpu"], ["cuda:0", "cuda:0"], ["cuda:0", "cuda:1"]

# (id, config, CUDA devices, rank, agents, expected per role)
LAYOUTS = [
    # Defaults follow the agents everywhere.
    ("cpu-only", marlhf(), 0, ONE_RANK, 2, every_role(CPU2, CPU2, CPU2, ["cpu"], CPU2)),
    ("one-gpu", marlhf(), 1, ONE_RANK, 2, every_role(GPU0, GPU0, GPU0, ["cuda:0"], GPU0)),
    ("four-gpus", marlhf(), 4, ONE_RANK, 2, every_role(GPU01, GPU01, GPU01, ["cuda:0"], GPU01)),
    (
        "every-field-set",
        marlhf(
            agent_devices=["cuda:0", "cuda:1"],
            comparator_devices=["cuda:2", "cuda:3"],
            reference_devices="cuda:3",
            reward_model_device="cuda:2",
            critic_devices=["cuda:2", "cuda:3"],
        ),
        4,
        ONE_RANK,
        2,
        every_role(GPU01, ["cuda:2", "cuda:3"], ["cuda:3", "cuda:3"], ["cuda:2"], ["cuda:2", "cuda:3"]),
    ),
    (
        "bare-cuda-and-cpu",
        marlhf(agent_devices="cuda", comparator_devices="cpu", reward_model_device="cpu"),
        1,
        ONE_RANK,
        2,
        every_role(GPU0, CPU2, GPU0, ["cpu"], GPU0),
    ),
    (
        "one-or-a-list-of-cpu",
        marlhf(agent_devices="cpu", comparator_devices=["cpu"], reference_devices=["cpu", "cpu"]),
        0,
        ONE_RANK,
        2,
        every_role(CPU2, CPU2, CPU2, ["cpu"], CPU2),
    ),
    (
        "madpo-without-marlhf-fields-follows-the-agents",
        madpo(comparator_devices="cpu"),
        4,
        ONE_RANK,
        2,
        {"agents": GPU01, "comparator": CPU2, "reward_model": ["cuda:0"], "critics": GPU01},
    ),
    ("three-agents-round-robin-on-two-gpus", madpo(), 2, ONE_RANK, 3, {"agents": ["cuda:0", "cuda:1", "cuda:0"]}),
    (
        "nothing-assumes-cuda-0-when-agents-are-elsewhere",
        marlhf(agent_devices=["cuda:3", "cuda:2"]),
        4,
        ONE_RANK,
        2,
        {
            "reward_model": ["cuda:3"],
            "reference": ["cuda:3", "cuda:2"],
            "critics": ["cuda:3", "cuda:2"],
            "comparator": ["cuda:3", "cuda:2"],
        },
    ),
    # Under torchrun each rank owns its slice of its node's GPUs; indices in the fields count within the slice.
    *[
        (
            f"torchrun-rank-{r}-owns-its-slice",
            marlhf(comparator_devices=["cuda:1", "cuda:0"], reward_model_device="cuda:1"),
            4,
            FOUR_RANKS[r],
            2,
            {"agents": agents, "comparator": comparator, "reward_model": reward_model},
        )
        for r, (agents, comparator, reward_model) in enumerate(
            [
                (GPU01, ["cuda:1", "cuda:0"], ["cuda:1"]),
                (["cuda:2", "cuda:3"], ["cuda:3", "cuda:2"], ["cuda:3"]),
            ]
            * 2
        )
    ],
    # A bare "cuda" is the rank's first GPU.
    ("torchrun-rank-0-bare-cuda", marlhf(agent_devices="cuda"), 4, FOUR_RANKS[0], 2, {"agents": GPU0}),
    ("torchrun-rank-1-bare-cuda", marlhf(agent_devices="cuda"), 4, FOUR_RANKS[1], 2, {"agents": ["cuda:2", "cuda:2"]}),
    # More ranks than GPUs share them; ranks without GPUs stay on the CPU.
    *[
        (f"three-ranks-two-gpus-rank-{r}", madpo(), 2, THREE_RANKS[r], 2, {"agents": agents})
        for r, agents in enumerate([GPU0, ["cuda:1", "cuda:1"], GPU0])
    ],
    *[(f"three-ranks-no-gpu-rank-{r}", madpo(), 0, THREE_RANKS[r], 2, {"agents": CPU2}) for r in range(3)],
]


@pytest.mark.parametrize(
    "config, cuda_count, dist, num_agents, expected", [pytest.param(*row[1:], id=row[0]) for row in LAYOUTS]
)
def test_device_fields_resolve_per_role(config, cuda_count, dist, num_agents, expected):
    got = layout(config, cuda_count, dist=dist, num_agents=num_agents)
    assert {role: got[role] for role in expected} == expected


@pytest.mark.parametrize("cuda_count", [0, 1, 4])
def test_default_count_comes_from_torch_cuda(monkeypatch, cuda_count):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda_count)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_count > 0)
    got = resolve_layout(MADPOIterConfig(), 2, dist=ONE_RANK, bf16_ok=True).as_strings()
    assert got == layout(MADPOIterConfig(), cuda_count)


def test_a_rank_names_its_streams_after_its_own_gpus():
    assert resolve_layout(madpo(), 2, cuda_count=4, dist=DistContext(1, 2, 1, 2), bf16_ok=True).cuda_offset == 2


# (CUDA devices, model_config dtype, bf16 supported, the agents' dtype, the CPU comparator's dtype)
DTYPES = [
    (0, None, True, torch.float32, torch.float32),
    # Models on the CPU stay float32 under "auto"; an explicit dtype applies everywhere.
    (1, None, True, torch.bfloat16, torch.float32),
    (4, "fp16", True, torch.float16, torch.float16),
    (4, "float32", True, torch.float32, torch.float32),
    # bf16 needs support on the GPU.
    (1, None, False, torch.float32, torch.float32),
]


@pytest.mark.parametrize("cuda_count, dtype, bf16_ok, agents, comparator", DTYPES)
def test_dtype_comes_from_model_config_per_device(cuda_count, dtype, bf16_ok, agents, comparator):
    resolved = resolve_layout(
        marlhf(comparator_devices="cpu"),
        2,
        model_config={} if dtype is None else {"dtype": dtype},
        cuda_count=cuda_count,
        dist=ONE_RANK,
        bf16_ok=bf16_ok,
    )
    assert resolved.dtypes["agents"] == [agents, agents]
    assert resolved.dtypes["comparator"] == [comparator, comparator]
    assert set(resolved.dtypes) == set(ROLES)


# (device fields, CUDA devices, rank, the start of the message)
ERRORS = [
    (
        {"agent_devices": "cuda:0"},
        0,
        ONE_RANK,
        "agent_devices: 'cuda:0' asks for CUDA, but no CUDA device is available.",
    ),
    (
        {"agent_devices": ["cuda:0", "cuda:4"]},
        4,
        ONE_RANK,
        "agent_devices: 'cuda:4' asks for CUDA device 4, but only 4",
    ),
    ({"reference_devices": ["cpu", "cpu", "cpu"]}, 0, ONE_RANK, "reference_devices length (3) must be 1 or 2."),
    ({"critic_devices": ["cuda:0", "cuda:1", "cuda:2"]}, 4, ONE_RANK, "critic_devices must have length 1 or 2"),
    (
        {"reward_model_device": "cuda:1"},
        1,
        ONE_RANK,
        "reward_model_device: 'cuda:1' asks for CUDA device 1, but only 1",
    ),
    ({"agent_devices": "tpu:0"}, 0, ONE_RANK, "agent_devices: 'tpu:0' is not a valid device"),
    # Indices count within the rank's slice: cuda:2 does not exist for a rank that owns two GPUs.
    ({"comparator_devices": "cuda:2"}, 4, FOUR_RANKS[1], "comparator_devices"),
]


@pytest.mark.parametrize("fields, cuda_count, dist, message", ERRORS)
def test_bad_device_fields_are_named_in_the_error(fields, cuda_count, dist, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        layout(marlhf(**fields), cuda_count, dist=dist)
