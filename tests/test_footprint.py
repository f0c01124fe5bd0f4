"""Model descriptions for Setup: parameters counted on the meta device, memory per agent, the fit-in-RAM warning."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from comlrl_lab.models.footprint import Footprint, describe_model, memory_check
from comlrl_lab.models.tiny_model import TINY_MODEL_NAME, tiny_model_path

# The embedded model: 4 layers, hidden 128, intermediate 384, 4 query and 4 key/value heads of 32.
PER_LAYER_ALL_LINEAR = 4 * 8 * (128 + 128) + 3 * 8 * (128 + 384)  # q, k, v, o + gate, up, down at r = 8


def test_the_embedded_model_is_described_without_loading_its_weights():
    footprint = describe_model(TINY_MODEL_NAME)
    loaded = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_model_path()).parameters())
    assert (footprint.architecture, footprint.parameters, footprint.dtype_bytes) == ("LlamaForCausalLM", loaded, 4)
    assert footprint.lora_parameters == 4 * PER_LAYER_ALL_LINEAR == 81_920
    assert footprint.full_fine_tuning_bytes == 16 * loaded  # weights, gradients, two AdamW moments
    assert footprint.lora_bytes == 4 * loaded + 16 * 81_920
    # peft's own choice for Llama is q_proj and v_proj; bf16 halves weights and gradients, not AdamW's moments.
    assert describe_model(TINY_MODEL_NAME, lora_target_modules=None).lora_parameters == 4 * 2 * 8 * 256
    assert describe_model(TINY_MODEL_NAME, dtype="bfloat16").full_fine_tuning_bytes == 12 * loaded


@pytest.mark.parametrize(
    ("available", "lora", "expected"),
    [
        (50_000_000, False, None),  # 2 x 16 MB x 1.3 = 41.6 MB fits
        (40_000_000, True, None),  # LoRA: 2 x (4 + 0.16) MB x 1.3 = 10.8 MB
        (
            40_000_000,
            False,
            "2 agents (1.0M parameters) fully fine-tuned need about 0.0 GiB of memory and 0.0 GiB is available; "
            "with LoRA (lora_r) they would need about 0.0 GiB",
        ),
    ],
)
def test_memory_check_warns_only_when_the_agents_do_not_fit(available, lora, expected):
    model = Footprint("LlamaForCausalLM", parameters=1_000_000, dtype_bytes=4, lora_parameters=10_000)
    assert memory_check([model, model], lora=lora, available=available) == expected


def test_a_135m_model_warns_in_gibibytes():
    smol = Footprint(
        "LlamaForCausalLM", parameters=134_515_008, dtype_bytes=4, lora_parameters=2_442_240
    )  # r = 8, all linear layers
    warning = memory_check([smol, smol], lora=False, available=4 * 2**30)
    assert warning == (
        "2 agents (134.5M parameters) fully fine-tuned need about 5.2 GiB of memory and 4.0 GiB is available; "
        "with LoRA (lora_r) they would need about 1.4 GiB"
    )
    assert memory_check([smol, smol], lora=True, available=4 * 2**30) is None


def test_a_spec_that_will_not_fit_gets_a_warning(monkeypatch):
    from comlrl_lab.engine.preflight import memory_warning
    from comlrl_lab.engine.presets import quickstart_spec
    from comlrl_lab.models import footprint

    monkeypatch.setattr(footprint, "available_memory_bytes", lambda: 10 * 2**20)
    warning = memory_warning(quickstart_spec())
    assert warning is not None and warning.startswith("2 agents (1.0M parameters) fully fine-tuned need about 0.0 GiB")
    monkeypatch.setattr(footprint, "available_memory_bytes", lambda: 2**30)
    assert memory_warning(quickstart_spec()) is None
