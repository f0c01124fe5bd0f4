"""The decode loop's one-token attention: sdpa's results from two matrix products, and a switch that always undoes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import comlrl_lab.models.single_query_attention as single
from comlrl_lab.models.single_query_attention import (
    NAME,
    single_query_attention,
    single_query_attention_for,
)


class _Module(torch.nn.Module):
    """What transformers' attention functions read from their module."""

    def __init__(self, heads: int, kv_heads: int):
        super().__init__()
        self.num_key_value_groups = heads // kv_heads
        self.is_causal = True


def _inputs(heads: int, kv_heads: int, rows: int = 3, keys: int = 7, dim: int = 8, queries: int = 1):
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(rows, heads, queries, dim, generator=generator)
    key = torch.randn(rows, kv_heads, keys, dim, generator=generator)
    value = torch.randn(rows, kv_heads, keys, dim, generator=generator)
    return query, key, value


def _by_hand(query, key, value, allowed, scale):
    """softmax(q k^T * scale) v per row and head, each query head reading KV head h // (H / H_kv)."""
    rows, heads, _, _ = query.shape
    group = heads // key.shape[1]
    out = torch.empty(rows, 1, heads, query.shape[-1])
    for b in range(rows):
        for h in range(heads):
            k, v = key[b, h // group][allowed[b]], value[b, h // group][allowed[b]]
            weights = torch.softmax((k @ query[b, h, 0]) * scale, dim=0)
            out[b, 0, h] = weights @ v
    return out


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (6, 2)])
def test_one_query_matches_attention_worked_out_per_head_and_sdpa(heads, kv_heads):
    query, key, value = _inputs(heads, kv_heads)
    allowed = torch.ones(3, 7, dtype=torch.bool)
    allowed[0, :2] = False  # left padding
    allowed[2, 5] = False
    mask = allowed[:, None, None, :]  # sdpa's boolean mask, (B, 1, 1, L)
    module = _Module(heads, kv_heads)

    out, weights = single_query_attention(module, query, key, value, mask, scaling=0.25)

    assert weights is None and out.shape == (3, 1, heads, 8)
    torch.testing.assert_close(out, _by_hand(query, key, value, allowed, 0.25), rtol=1e-5, atol=1e-6)
    reference, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-6)


def test_float64_and_a_row_with_no_key_match_sdpa():
    query, key, value = (t.double() for t in _inputs(6, 2))
    mask = torch.ones(3, 1, 1, 7, dtype=torch.bool)
    mask[1] = False  # nothing to attend: sdpa gives zeros
    out, _ = single_query_attention(_Module(6, 2), query, key, value, mask)
    reference, _ = sdpa_attention_forward(_Module(6, 2), query, key, value, mask)
    assert out.dtype == torch.float64 and torch.equal(out[1], torch.zeros(1, 6, 8, dtype=torch.float64))
    torch.testing.assert_close(out, reference, rtol=1e-12, atol=1e-12)


def test_an_additive_mask_and_no_mask_match_sdpa():
    query, key, value = _inputs(4, 4)
    additive = torch.zeros(3, 1, 1, 7).masked_fill_(torch.arange(7) < 3, torch.finfo(torch.float32).min)
    for mask in (additive, None):
        out, _ = single_query_attention(_Module(4, 4), query, key, value, mask)  # default scale: dim ** -0.5
        expected = F.scaled_dot_product_attention(query, key, value, attn_mask=mask).transpose(1, 2)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "change",
    [
        dict(queries=2),  # a prefill: several query tokens
        dict(dtype=torch.bfloat16),  # half precision keeps sdpa's float32 accumulation
        dict(dropout=0.1),
        dict(per_head_mask=True),
        dict(softcap=30.0),
    ],
)
def test_calls_it_does_not_serve_go_to_sdpa_unchanged(change, monkeypatch):
    query, key, value = _inputs(4, 4, queries=change.get("queries", 1))
    dtype = change.get("dtype", torch.float32)
    query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    mask = torch.ones(3, 4 if change.get("per_head_mask") else 1, query.shape[2], 7, dtype=torch.bool)
    extra = {"softcap": change["softcap"]} if "softcap" in change else {}
    handed = []
    monkeypatch.setattr(single, "_sdpa", lambda *args, **kwargs: handed.append((args, kwargs)) or ("sdpa", None))

    dropout = change.get("dropout", 0.0)
    out = single_query_attention(_Module(4, 4), query, key, value, mask, dropout=dropout, scaling=0.3, **extra)

    assert out == ("sdpa", None) and len(handed) == 1
    args, kwargs = handed[0]
    assert args[1] is query and args[2] is key and args[3] is value and args[4] is mask
    assert kwargs == {"dropout": dropout, "scaling": 0.3, **extra}


def test_the_switch_applies_to_a_cpu_sdpa_llama_and_undoes_itself(model_dir):
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
    with single_query_attention_for(model) as switched:
        assert switched and model.config._attn_implementation == NAME
    assert model.config._attn_implementation == "sdpa"

    with single_query_attention_for(model) as outer, single_query_attention_for(model) as inner:
        assert outer and not inner  # the inner block leaves the outer one's switch alone
    assert model.config._attn_implementation == "sdpa"

    with pytest.raises(RuntimeError, match="stop"), single_query_attention_for(model):
        raise RuntimeError("stop")
    assert model.config._attn_implementation == "sdpa"

    eager = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager")
    with single_query_attention_for(eager) as switched:
        assert not switched and eager.config._attn_implementation == "eager"

    model.config.model_type = "not-listed"  # an architecture whose modeling code was not checked
    with single_query_attention_for(model) as switched:
        assert not switched and model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("embedded", [False, True])
def test_decode_steps_under_the_switch_give_sdpas_logits(model_dir, embedded):
    """A prefill and three one-token steps with a KV cache, once under each attention: the same logits. The test
    model has 4 query heads over 2 KV heads, the embedded tiny model 4 over 4."""
    from transformers import DynamicCache

    from comlrl_lab.models.tiny_model import tiny_model_path

    path = tiny_model_path() if embedded else model_dir
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
    assert model.config.num_key_value_heads == (4 if embedded else 2)
    input_ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])

    def steps() -> torch.Tensor:
        cache, ids, attention, logits = DynamicCache(config=model.config), input_ids, mask, []
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        for _ in range(4):
            out = model(input_ids=ids, attention_mask=attention, position_ids=positions, cache=cache, use_cache=True)
            logits.append(out.logits[:, -1])
            ids = out.logits[:, -1].argmax(-1, keepdim=True)
            attention = torch.cat([attention, attention.new_ones(2, 1)], dim=-1)
            positions = positions[:, -1:] + 1
        return torch.stack(logits)

    served = []
    original = single.serves

    def counting(*args, **kwargs):
        served.append(original(*args, **kwargs))
        return served[-1]

    with torch.no_grad():
        reference = steps()
        with single_query_attention_for(model) as switched_on, pytest.MonkeyPatch.context() as patch:
            patch.setattr(single, "serves", counting)
            switched = steps()
    layers = model.config.num_hidden_layers
    assert switched_on and served == [False] * layers + [True] * 3 * layers  # the prefill goes to sdpa
    torch.testing.assert_close(switched, reference, rtol=1e-5, atol=1e-5)


def test_the_own_decode_loop_runs_its_steps_through_it_and_samples_the_same_tokens(sample_two_prompts, monkeypatch):
    served = []
    original = single.serves
    monkeypatch.setattr(single, "serves", lambda *a, **k: served.append(original(*a, **k)) or served[-1])

    def sample(**change):
        served.clear()
        return sample_two_prompts(**change)

    own = sample()
    layers = sample_two_prompts.model.config.num_hidden_layers
    assert served.count(True) >= layers and served.count(True) % layers == 0  # whole steps, every layer
    assert served.count(False) == 0  # the shared prompt prefix was prefilled before the switch
    assert sample(single_query_attention=False) == own and served == []
    assert sample(own_decode_loop=False) == own and served == []  # generate keeps sdpa
    assert sample_two_prompts.model.config._attn_implementation == "sdpa"
