"""Every device field resolved for CPU-only, one-GPU and four-GPU machines, alone and under torchrun.

Device counts are injected or monkeypatched; no CUDA device is ever created, so this runs on any CPU host.
"""

from __future__ import annotations

import pytest
import torch

from comlrl_lab.trainers.preference import MADPOIterConfig, MARLHFIterConfig
from comlrl_lab.trainers.preference.devices import ROLES, resolve_layout
from comlrl_lab.trainers.preference.distributed import DistContext

ONE_RANK = DistContext()


def layout(config, cuda_count, dist=ONE_RANK, model_config=None, bf16_ok=True, num_agents=2):
    return resolve_layout(
        config, num_agents, model_config=model_config, cuda_count=cuda_count, dist=dist, bf16_ok=bf16_ok
    ).as_strings()


# (cuda_count, fields, expected per role); defaults follow the agents everywhere.
CASES = [
    (
        0,
        {},
        {
            "agents": ["cpu", "cpu"],
            "comparator": ["cpu", "cpu"],
            "current_copy": ["cpu", "cpu"],
            "reference": ["cpu", "cpu"],
            "reward_model": ["cpu"],
            "critics": ["cpu", "cpu"],
        },
    ),
    (
        1,
        {},
        {
            "agents": ["cuda:0", "cuda:0"],
            "comparator": ["cuda:0", "cuda:0"],
            "current_copy": ["cuda:0", "cuda:0"],
            "reference": ["cuda:0", "cuda:0"],
            "reward_model": ["cuda:0"],
            "critics": ["cuda:0", "cuda:0"],
        },
    ),
    (
        4,
        {},
        {
            "agents": ["cuda:0", "cuda:1"],
            "comparator": ["cuda:0", "cuda:1"],
            "current_copy": ["cuda:0", "cuda:1"],
            "reference": ["cuda:0", "cuda:1"],
            "reward_model": ["cuda:0"],
            "critics": ["cuda:0", "cuda:1"],
        },
    ),
    (
        4,
        {
            "agent_devices": ["cuda:0", "cuda:1"],
            "comparator_devices": ["cuda:2", "cuda:3"],
            "reference_devices": "cuda:3",
            "reward_model_device": "cuda:2",
            "critic_devices": ["cuda:2", "cuda:3"],
        },
        {
            "agents": ["cuda:0", "cuda:1"],
            "comparator": ["cuda:2", "cuda:3"],
            "current_copy": ["cuda:2", "cuda:3"],
            "reference": ["cuda:3", "cuda:3"],
            "reward_model": ["cuda:2"],
            "critics": ["cuda:2", "cuda:3"],
        },
    ),
    (
        1,
        {"agent_devices": "cuda", "comparator_devices": "cpu", "reward_model_device": "cpu"},
        {
            "agents": ["cuda:0", "cuda:0"],
            "comparator": ["cpu", "cpu"],
            "current_copy": ["cpu", "cpu"],
            "reference": ["cuda:0", "cuda:0"],
            "reward_model": ["cpu"],
            "critics": ["cuda:0", "cuda:0"],
        },
    ),
    (
        0,
        {"agent_devices": "cpu", "comparator_devices": ["cpu"], "reference_devices": ["cpu", "cpu"]},
        {
            "agents": ["cpu", "cpu"],
            "comparator": ["cpu", "cpu"],
            "current_copy": ["cpu", "cpu"],
            "reference": ["cpu", "cpu"],
            "reward_model": ["cpu"],
            "critics": ["cpu", "cpu"],
        },
    ),
]


def marlhf_config(fields):
    return MARLHFIterConfig(reference_kl_enabled=True, rl_algorithm="maac", **fields)


@pytest.mark.parametrize("cuda_count, fields, expected", CASES)
def test_every_device_field_resolves_for_each_layout(cuda_count, fields, expected):
    assert layout(marlhf_config(fields), cuda_count) == expected


def test_madpo_configs_without_marlhf_fields_follow_the_agents():
    got = layout(MADPOIterConfig(comparator_devices="cpu"), 4)
    assert got["agents"] == ["cuda:0", "cuda:1"] and got["comparator"] == ["cpu", "cpu"]
    assert got["reward_model"] == ["cuda:0"] and got["critics"] == ["cuda:0", "cuda:1"]


def test_three_agents_on_two_gpus_are_spread_round_robin():
    assert layout(MADPOIterConfig(), 2, num_agents=3)["agents"] == ["cuda:0", "cuda:1", "cuda:0"]


@pytest.mark.parametrize("cuda_count", [0, 1, 4])
def test_default_count_comes_from_torch_cuda(monkeypatch, cuda_count):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda_count)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_count > 0)
    got = resolve_layout(MADPOIterConfig(), 2, dist=ONE_RANK, bf16_ok=True).as_strings()
    assert got == layout(MADPOIterConfig(), cuda_count)


@pytest.mark.parametrize(
    "cuda_count, dtype, expected",
    [(0, None, torch.float32), (1, None, torch.bfloat16), (4, "fp16", torch.float16), (4, "float32", torch.float32)],
)
def test_dtype_comes_from_model_config_per_device(cuda_count, dtype, expected):
    resolved = resolve_layout(
        marlhf_config({"comparator_devices": "cpu"}),
        2,
        model_config={} if dtype is None else {"dtype": dtype},
        cuda_count=cuda_count,
        dist=ONE_RANK,
        bf16_ok=True,
    )
    assert resolved.dtypes["agents"] == [expected, expected]
    # Models on the CPU stay float32 under "auto"; an explicit dtype applies everywhere.
    assert resolved.dtypes["comparator"] == [expected if dtype else torch.float32] * 2
    assert set(resolved.dtypes) == set(ROLES)


def test_bf16_needs_support_on_the_gpu():
    resolved = resolve_layout(MADPOIterConfig(), 2, cuda_count=1, dist=ONE_RANK, bf16_ok=False)
    assert resolved.dtypes["agents"] == [torch.float32, torch.float32]


def test_each_torchrun_rank_owns_its_slice_of_the_gpus():
    config = marlhf_config({"comparator_devices": ["cuda:1", "cuda:0"], "reward_model_device": "cuda:1"})
    ranks = [DistContext(rank=r, world_size=4, local_rank=r % 2, local_world_size=2) for r in range(4)]
    got = [layout(config, 4, dist=d) for d in ranks]
    assert [g["agents"] for g in got] == [["cuda:0", "cuda:1"], ["cuda:2", "cuda:3"]] * 2
    assert [g["comparator"] for g in got] == [["cuda:1", "cuda:0"], ["cuda:3", "cuda:2"]] * 2
    assert [g["reward_model"] for g in got] == [["cuda:1"], ["cuda:3"]] * 2
    # A bare "cuda" is the rank's first GPU.
    assert [layout(marlhf_config({"agent_devices": "cuda"}), 4, dist=d)["agents"] for d in ranks[:2]] == [
        ["cuda:0", "cuda:0"],
        ["cuda:2", "cuda:2"],
    ]
    # Indices count within the rank's slice: cuda:2 does not exist for a rank that owns two GPUs.
    with pytest.raises(ValueError, match="comparator_devices"):
        layout(marlhf_config({"comparator_devices": "cuda:2"}), 4, dist=ranks[1])


def test_more_ranks_than_gpus_share_them_and_cpu_ranks_stay_on_cpu():
    ranks = [DistContext(rank=r, world_size=3, local_rank=r, local_world_size=3) for r in range(3)]
    assert [layout(MADPOIterConfig(), 2, dist=d)["agents"] for d in ranks] == [
        ["cuda:0", "cuda:0"],
        ["cuda:1", "cuda:1"],
        ["cuda:0", "cuda:0"],
    ]
    assert [layout(MADPOIterConfig(), 0, dist=d)["agents"] for d in ranks] == [["cpu", "cpu"]] * 3
    assert (
        resolve_layout(MADPOIterConfig(), 2, cuda_count=4, dist=DistContext(1, 2, 1, 2), bf16_ok=True).cuda_offset == 2
    )


@pytest.mark.parametrize(
    "fields, cuda_count, message",
    [
        ({"agent_devices": "cuda:0"}, 0, "agent_devices: 'cuda:0' asks for CUDA, but no CUDA device is available."),
        ({"agent_devices": ["cuda:0", "cuda:4"]}, 4, "agent_devices: 'cuda:4' asks for CUDA device 4, but only 4"),
        ({"reference_devices": ["cpu", "cpu", "cpu"]}, 0, "reference_devices length (3) must be 1 or 2."),
        ({"critic_devices": ["cuda:0", "cuda:1", "cuda:2"]}, 4, "critic_devices must have length 1 or 2"),
        ({"reward_model_device": "cuda:1"}, 1, "reward_model_device: 'cuda:1' asks for CUDA device 1, but only 1"),
        ({"agent_devices": "tpu:0"}, 0, "agent_devices: 'tpu:0' is not a valid device"),
    ],
)
def test_bad_device_fields_are_named_in_the_error(fields, cuda_count, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        layout(marlhf_config(fields), cuda_count)


def test_nothing_assumes_cuda_0_when_agents_are_elsewhere():
    got = layout(marlhf_config({"agent_devices": ["cuda:3", "cuda:2"]}), 4)
    assert got["reward_model"] == ["cuda:3"] and got["reference"] == ["cuda:3", "cuda:2"]
    assert got["critics"] == ["cuda:3", "cuda:2"] and got["comparator"] == ["cuda:3", "cuda:2"]
