"""The decode loop's preallocated KV cache: each step written in place, the same logits and tokens as growth by
concatenation, on the embedded model and on a model with a chat template."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from gguf_fixtures import write_tiny_gguf

from comlrl_lab.models import decode_loop, generation
from comlrl_lab.models.chat import render_prompt
from comlrl_lab.models.loading import load_model, load_tokenizer
from comlrl_lab.models.preallocated_cache import preallocate
from comlrl_lab.models.tiny_model import tiny_model_path

PROMPTS = ["the red cat sat on the mat", "a dog", "the green bird sang all day long", "rain"]


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory) -> str:
    from comlrl_lab.models.gguf import convert_gguf

    folder = tmp_path_factory.mktemp("chat")
    convert_gguf(write_tiny_gguf(folder / "tiny.gguf"), folder / "model")
    return str(folder / "model")


def _sample_watching_scores(model, tokenizer, prompts, settings, monkeypatch):
    """Each row's completion ids and finished flag, and every score row the sampler was handed, by (batch row, step)."""
    seen: dict[tuple[int, int], torch.Tensor] = {}
    choose = generation.RowSeededSampler.choose

    def watched(self, scores, rows, step):
        for row, row_scores in zip(rows.tolist(), scores):
            seen[(row, step)] = row_scores.clone()
        return choose(self, scores, rows, step)

    monkeypatch.setattr(generation.RowSeededSampler, "choose", watched)
    result = generation.sample_candidates(model, tokenizer, prompts, 4, settings, None, row_seeds=[3, 4, 5, 6])
    monkeypatch.setattr(generation.RowSeededSampler, "choose", choose)
    return [[(s.completion_ids, s.finished) for s in row] for row in result], seen


@pytest.mark.parametrize("shared_prefix_attention", [True, False])
@pytest.mark.parametrize("prefill_once", [True, False])
@pytest.mark.parametrize("chat", [False, True], ids=["embedded", "chat-template"])
def test_in_place_steps_give_every_row_the_same_scores_and_tokens(
    chat, prefill_once, shared_prefix_attention, chat_model_dir, monkeypatch
):
    folder = chat_model_dir if chat else tiny_model_path()
    tokenizer = load_tokenizer(folder)
    model = load_model(folder, device="cpu", dtype="float32").eval()
    prompts = [render_prompt(tokenizer, p) for p in PROMPTS] if chat else PROMPTS
    settings = generation.SamplingSettings(
        max_new_tokens=12,
        temperature=1.5,
        top_p=1.0,
        top_k=None,
        prefill_once=prefill_once,
        shared_prefix_attention=shared_prefix_attention,
    )
    # An EOS that about half the rows sample, so that rows end at different steps and leave the batch.
    first, _ = _sample_watching_scores(model, tokenizer, prompts, settings, monkeypatch)
    rows = [set(ids) for row in first for ids, _ in row]
    model.generation_config.eos_token_id = min(
        set().union(*rows), key=lambda token: abs(sum(token in row for row in rows) - len(rows) / 2)
    )
    sized: list[str] = []

    def watched_preallocate(cache, more_positions):
        preallocate(cache, more_positions)
        sized.append(type(cache.layers[0]).__name__)

    monkeypatch.setattr(decode_loop, "preallocate", watched_preallocate)
    runs = {}
    for preallocated in (True, False):
        sized.clear()
        runs[preallocated] = _sample_watching_scores(
            model, tokenizer, prompts, dataclasses.replace(settings, preallocated_cache=preallocated), monkeypatch
        )
        assert sized == (["PreallocatedLayer"] if preallocated else [])  # one call of 16 rows
    (samples, scores), (reference_samples, reference_scores) = runs[True], runs[False]
    assert samples == reference_samples
    finished = [done for row in samples for _, done in row]
    assert any(finished) and not all(finished)  # rows left the batch at different steps
    assert scores.keys() == reference_scores.keys()
    for key, row_scores in scores.items():
        assert torch.equal(row_scores, reference_scores[key]), key


def test_a_layer_writes_each_step_into_one_buffer_and_keeps_the_rows_it_is_told():
    from transformers import DynamicCache

    torch.manual_seed(0)
    cache = DynamicCache()
    prompt = torch.randn(3, 2, 4, 5), torch.randn(3, 2, 4, 5)  # (rows, kv heads, positions, head dim)
    cache.update(*prompt, layer_idx=0)
    preallocate(cache, more_positions=3)
    layer = cache.layers[0]
    buffer = layer.key_buffer.data_ptr()
    steps = [(torch.randn(3, 2, 1, 5), torch.randn(3, 2, 1, 5)) for _ in range(2)]
    for step in steps:
        keys, values = cache.update(*step, layer_idx=0)
    assert torch.equal(keys, torch.cat([prompt[0], steps[0][0], steps[1][0]], dim=-2))
    assert torch.equal(values, torch.cat([prompt[1], steps[0][1], steps[1][1]], dim=-2))
    assert layer.key_buffer.data_ptr() == buffer and keys.data_ptr() == buffer  # written in place, read as a view
    assert cache.get_seq_length() == 6
    cache.batch_select_indices(torch.tensor([0, 2]))
    keys, _ = cache.update(torch.zeros(2, 2, 1, 5), torch.zeros(2, 2, 1, 5), layer_idx=0)
    assert torch.equal(keys[:, :, :6], torch.cat([prompt[0], steps[0][0], steps[1][0]], dim=-2)[[0, 2]])
    with pytest.raises(RuntimeError, match="sized for 7 positions and was handed position 8"):
        cache.update(torch.zeros(2, 2, 1, 5), torch.zeros(2, 2, 1, 5), layer_idx=0)
    with pytest.raises(NotImplementedError, match="only grows and drops rows"):
        layer.crop(-1)
