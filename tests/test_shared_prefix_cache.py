"""The decode loop's shared-prefix KV cache: each prompt's keys held once, attention as over the joined keys."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import comlrl_lab.models.decode_loop as decode_loop
from comlrl_lab.models.shared_prefix_cache import SharedPrefixCache, shared_prefix_cache
from comlrl_lab.models.single_query_attention import single_query_attention, single_query_attention_for


class _Module(torch.nn.Module):
    """What transformers' attention functions read from their module."""

    def __init__(self, heads: int, kv_heads: int):
        super().__init__()
        self.num_key_value_groups = heads // kv_heads
        self.is_causal = True
        self.layer_idx = 0


PROMPT_OF_ROW = torch.tensor([0, 0, 2, 1, 0, 2])  # prompt 0 has three rows, 1 one, 2 two; rows not grouped


def _case(heads: int = 6, kv_heads: int = 2, prompts: int = 3, prefix: int = 5, suffix: int = 3, dim: int = 8):
    """A one-layer cache of ``prompts`` prefilled prompts, its rows' suffixes stored, and one query per row."""
    generator = torch.Generator().manual_seed(0)
    rows = len(PROMPT_OF_ROW)
    prefix_keys, prefix_values = (torch.randn(prompts, kv_heads, prefix, dim, generator=generator) for _ in range(2))
    suffix_keys, suffix_values = (torch.randn(rows, kv_heads, suffix, dim, generator=generator) for _ in range(2))
    query = torch.randn(rows, heads, 1, dim, generator=generator)
    prefilled = DynamicCache()
    prefilled.update(prefix_keys, prefix_values, 0)
    cache = shared_prefix_cache(None, prefilled, PROMPT_OF_ROW)
    key, value = cache.update(suffix_keys, suffix_values, 0)
    joined_keys = torch.cat([prefix_keys[PROMPT_OF_ROW], suffix_keys], dim=-2)
    joined_values = torch.cat([prefix_values[PROMPT_OF_ROW], suffix_values], dim=-2)
    return cache, query, key, value, joined_keys, joined_values


def _allowed() -> torch.Tensor:
    allowed = torch.ones(len(PROMPT_OF_ROW), 8, dtype=torch.bool)  # 5 prompt keys + 3 suffix keys
    allowed[PROMPT_OF_ROW == 2, :2] = False  # prompt 2 is left-padded by two
    allowed[3, 6] = False
    return allowed


def test_the_cache_stores_only_the_suffix_and_counts_the_prompt_in_its_length():
    cache, _, key, _, joined_keys, _ = _case()
    assert isinstance(cache, SharedPrefixCache) and isinstance(cache, DynamicCache)
    assert key.shape == (6, 2, 3, 8) and torch.equal(key, joined_keys[:, :, 5:])
    assert cache.prefix(0)[0].shape[0] == 3  # one row per prompt, never copied per candidate
    assert cache.get_seq_length() == 8 and cache.get_mask_sizes(1, 0) == (9, 0)
    assert cache.slot_of_row.tolist() == [0, 1, 0, 0, 2, 1] and cache.rows_per_prompt == 3


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (6, 2)])
def test_attention_equals_attention_over_the_joined_keys(heads, kv_heads):
    cache, query, key, value, joined_keys, joined_values = _case(heads, kv_heads)
    module = _Module(heads, kv_heads)
    mask = _allowed()[:, None, None, :]

    out, _ = single_query_attention(module, query, key, value, mask, scaling=0.3, shared_prefix=cache)

    reference, _ = sdpa_attention_forward(module, query, joined_keys, joined_values, mask, scaling=0.3)
    assert out.shape == (6, 1, heads, 8)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)
    # Worked out for one row and head: row 2 reads prompt 2 from its third key, and its own suffix.
    keys = joined_keys[2, 0, 2:]
    weights = torch.softmax(keys @ query[2, 0, 0] * 0.3, dim=0)
    torch.testing.assert_close(out[2, 0, 0], weights @ joined_values[2, 0, 2:], rtol=1e-5, atol=1e-6)


def test_an_additive_mask_and_no_mask_equal_the_joined_attention():
    cache, query, key, value, joined_keys, joined_values = _case(4, 4)
    module = _Module(4, 4)
    additive = torch.zeros(6, 1, 1, 8).masked_fill_(~_allowed()[:, None, None, :], torch.finfo(torch.float32).min)
    for mask in (additive, None):
        out, _ = single_query_attention(module, query, key, value, mask, shared_prefix=cache)
        reference, _ = sdpa_attention_forward(module, query, joined_keys, joined_values, mask)
        torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)


def test_a_prompt_whose_rows_all_left_is_dropped_and_the_rest_renumbered():
    cache, query, key, value, joined_keys, joined_values = _case()
    keep = torch.tensor([4, 2, 1])  # rows of prompts 0, 2 and 0: prompt 1 has none left
    cache.batch_select_indices(keep)
    assert cache.prefix(0)[0].shape[0] == 2 and cache.prompt_of_row.tolist() == [0, 1, 0]
    assert cache.slot_of_row.tolist() == [0, 0, 1] and cache.rows_per_prompt == 2
    module, mask = _Module(6, 2), _allowed()[keep][:, None, None, :]

    out, _ = single_query_attention(module, query[keep], key[keep], value[keep], mask, shared_prefix=cache)

    reference, _ = sdpa_attention_forward(module, query[keep], joined_keys[keep], joined_values[keep], mask)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)


def test_float64_attention_equals_the_joined_attention():
    cache, query, key, value, joined_keys, joined_values = _case()
    cache._prefix = [(k.double(), v.double()) for k, v in cache._prefix]
    query, key, value = query.double(), key.double(), value.double()
    mask = _allowed()[:, None, None, :]
    out, _ = single_query_attention(_Module(6, 2), query, key, value, mask, shared_prefix=cache)
    joined_keys, joined_values = joined_keys.double(), joined_values.double()
    reference, _ = sdpa_attention_forward(_Module(6, 2), query, joined_keys, joined_values, mask)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, reference, rtol=1e-12, atol=1e-12)


def test_a_forward_that_missed_the_prefix_in_a_layer_is_an_error_not_a_wrong_answer():
    cache, query, key, value, *_ = _case()
    with pytest.raises(RuntimeError, match="0 of 1 layers"):
        cache.check_attended()
    single_query_attention(_Module(6, 2), query, key, value, None, shared_prefix=cache)
    cache.check_attended()  # one layer, attended once: fine, and the count starts again
    with pytest.raises(RuntimeError, match="0 of 1 layers"):
        cache.check_attended()


def test_what_the_decode_loop_never_does_is_refused():
    cache, *_ = _case()
    for call in (
        lambda: cache.crop(-1),
        lambda: cache.batch_repeat_interleave(2),
        cache.reset,
        lambda: cache.reorder_cache(torch.tensor([0])),
    ):
        with pytest.raises(NotImplementedError):
            call()
    sliding = DynamicCache()
    sliding.update(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4), 0)
    sliding.layers[0].is_sliding = True
    with pytest.raises(ValueError, match="sliding"):
        shared_prefix_cache(None, sliding, torch.tensor([0]))


def test_rows_that_leave_keep_their_prompts_and_regroup():
    cache, query, key, value, joined_keys, joined_values = _case()
    keep = torch.tensor([5, 0, 3])
    cache.batch_select_indices(keep)
    assert cache.prompt_of_row.tolist() == [2, 0, 1] and cache.rows_per_prompt == 1
    assert cache.slot_of_row.tolist() == [0, 0, 0] and cache.prefix(0)[0].shape[0] == 3
    module, mask = _Module(6, 2), _allowed()[keep][:, None, None, :]

    out, _ = single_query_attention(module, query[keep], key[keep], value[keep], mask, shared_prefix=cache)

    reference, _ = sdpa_attention_forward(module, query[keep], joined_keys[keep], joined_values[keep], mask)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)


def test_a_call_it_does_not_serve_goes_to_sdpa_over_the_joined_keys():
    cache, _, key, value, joined_keys, joined_values = _case(4, 4)
    query = torch.randn(6, 4, 2, 8, generator=torch.Generator().manual_seed(1))  # two query tokens per row
    mask = torch.ones(6, 1, 2, 8, dtype=torch.bool).tril(diagonal=6)
    module = _Module(4, 4)

    out, _ = single_query_attention(module, query, key, value, mask, shared_prefix=cache)

    reference, _ = sdpa_attention_forward(module, query, joined_keys, joined_values, mask)
    torch.testing.assert_close(out, reference, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("embedded", [False, True])
def test_decode_steps_from_the_shared_prefix_give_the_expanded_caches_logits(model_dir, embedded):
    """Two prompts prefilled once, continued by five rows: the same logits for three steps as when every row holds
    its own copy of its prompt's keys. The test model has 4 query heads over 2 KV heads, the embedded one 4 over 4."""
    from comlrl_lab.models.tiny_model import tiny_model_path

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path() if embedded else model_dir).eval()
    prompts = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    prompt_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    prompt_of_row = torch.tensor([1, 0, 0, 1, 1])
    positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)

    def prefilled() -> DynamicCache:
        cache = DynamicCache(config=model.config)
        model(input_ids=prompts, attention_mask=prompt_mask, position_ids=positions, cache=cache, use_cache=True)
        return cache

    def steps(shared: bool) -> torch.Tensor:
        cache = prefilled()
        extra = {}
        if shared:
            cache = shared_prefix_cache(model.config, cache, prompt_of_row)
            extra["shared_prefix"] = cache
        else:
            cache.batch_select_indices(prompt_of_row)
        ids = torch.tensor([[3], [4], [5], [6], [7]])
        mask, position, logits = prompt_mask[prompt_of_row], positions[prompt_of_row, -1:] + 1, []
        for _ in range(3):
            mask = torch.cat([mask, mask.new_ones(5, 1)], dim=-1)
            out = model(input_ids=ids, attention_mask=mask, position_ids=position, cache=cache, use_cache=True, **extra)
            logits.append(out.logits[:, -1])
            ids, position = out.logits[:, -1].argmax(-1, keepdim=True), position + 1
        return torch.stack(logits)

    with torch.no_grad(), single_query_attention_for(model) as switched:
        shared, expanded = steps(True), steps(False)
    assert switched
    torch.testing.assert_close(shared, expanded, rtol=1e-5, atol=1e-5)


def test_the_sampler_keeps_each_prompt_once_and_samples_the_same_tokens(sample_two_prompts, monkeypatch):
    built = []
    original = decode_loop.shared_prefix_cache

    def recording(config, prefilled, prompt_of_row):
        cache = original(config, prefilled, prompt_of_row)
        built.append((cache.prefix(0)[0].shape[0], prompt_of_row.tolist()))
        return cache

    monkeypatch.setattr(decode_loop, "shared_prefix_cache", recording)

    def sample(**change):
        built.clear()
        return sample_two_prompts(**change)

    shared = sample()
    assert built == [(2, [0, 0, 0, 0, 1, 1, 1, 1])]  # shortest prompt first: "a dog" is prompt 0
    assert sample(shared_prefix_attention=False) == shared and built == []
    assert sample(single_query_attention=False) == shared and built == []  # sdpa: the expanded cache
    sample_two_prompts.model.to(torch.bfloat16)
    sample()
    assert built == []  # half-precision steps go to sdpa, so the cache is expanded for it


def test_the_decode_loop_stops_when_a_step_did_not_attend_over_the_prefix(model_dir, monkeypatch):
    """The attention switched back under the loop (another thread restoring it, say): an error, not wrong logits."""
    import contextlib

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    prompts = torch.tensor([[5, 6, 7], [8, 9, 10]])
    prefilled = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=prompts[:, :-1], cache=prefilled, use_cache=True)
    monkeypatch.setattr(decode_loop, "single_query_attention_for", lambda model: contextlib.nullcontext(True))
    rows = torch.tensor([0, 0, 1])
    with torch.no_grad(), pytest.raises(RuntimeError, match="reached its attention in 0 of 2 layers"):
        decode_loop.decode_rows(
            model,
            "cache",
            prompts[rows],
            torch.ones(3, 3, dtype=torch.long),
            lambda scores, rows, step: scores.argmax(-1),
            4,
            [],
            cache=prefilled,
            prompt_of_row=rows,
        )


def test_rows_of_a_prefilled_cache_need_the_cache(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with pytest.raises(ValueError, match="no cache was given"):
        decode_loop.decode_rows(
            model,
            "cache",
            torch.ones(2, 3, dtype=torch.long),
            torch.ones(2, 3, dtype=torch.long),
            lambda scores, rows, step: scores.argmax(-1),
            2,
            [],
            prompt_of_row=torch.tensor([0, 0]),
        )
