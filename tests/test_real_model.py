"""SmolLM2-135M-Instruct, registered with ``comlrl-lab models add smollm2-135m-instruct``: skipped where it is not.

These read the real converted folder (517 MB), so they are ``real_model`` and ``slow``; CI never downloads it.
"""

from __future__ import annotations

import pytest
import torch

from comlrl_lab.data.tasks import get_task
from comlrl_lab.data.tasks.lexicon import polarity
from comlrl_lab.models.chat import render_prompt, stop_at_end_of_turn
from comlrl_lab.models.footprint import describe_model
from comlrl_lab.models.generation import SamplingSettings, sample_candidates
from comlrl_lab.models.loading import load_model, load_tokenizer
from comlrl_lab.models.registry import SMOLLM2_135M_INSTRUCT, registered_path

NAME = SMOLLM2_135M_INSTRUCT.name
pytestmark = [
    pytest.mark.real_model,
    pytest.mark.slow,
    pytest.mark.skipif(
        registered_path(NAME) is None, reason=f"{NAME} is not registered (comlrl-lab models add {NAME})"
    ),
]


@pytest.fixture(scope="module")
def smollm2():
    return load_model(NAME, device="cpu").eval(), load_tokenizer(NAME)


def test_the_registered_folder_is_smollm2_with_its_chat_template(smollm2):
    model, tokenizer = smollm2
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tokenizer.chat_template and tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id == 2


def test_it_is_described_from_its_config():
    footprint = describe_model(NAME)
    # 30 layers of q, o (576 -> 576), k, v (576 -> 192), gate, up (576 -> 1536) and down, at r = 8.
    per_layer = 8 * (2 * (576 + 576) + 2 * (576 + 192) + 3 * (576 + 1536))
    assert (footprint.parameters, footprint.lora_parameters) == (134_515_008, 30 * per_layer)


def test_through_its_chat_template_it_writes_the_asked_stance_and_ends_its_turn(smollm2):
    model, tokenizer = smollm2
    stop_at_end_of_turn(model, tokenizer)
    prompts = [render_prompt(tokenizer, f"Write one {tone} sentence about the river.") for tone in ("happy", "sad")]
    settings = SamplingSettings(max_new_tokens=40, temperature=0.2, top_p=0.9)
    (happy,), (sad,) = sample_candidates(model, tokenizer, prompts, 1, settings, None, row_seeds=[0, 1])
    assert happy.finished and sad.finished and happy.completion_ids[-1] == tokenizer.eos_token_id
    # VADER is a lexicon: "a cruel and unforgiving beast" scored +0.10 in one draw, so the check is the ordering.
    assert polarity(happy.text) > 0.05 and polarity(sad.text) < polarity(happy.text), (happy.text, sad.text)


def test_a_task_prompt_tokenises_as_the_template_does(smollm2):
    _, tokenizer = smollm2
    item = get_task("stance_agreement").eval_items()[0]
    text = get_task("stance_agreement").formatters[0](item)
    messages = [{"role": "user", "content": text}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    assert tokenizer(render_prompt(tokenizer, text))["input_ids"] == list(ids)
    assert torch.tensor(ids)[0].item() == tokenizer.convert_tokens_to_ids("<|im_start|>")
