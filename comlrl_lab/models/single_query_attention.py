"""Attention for one-token decode steps on the CPU: two batched matrix products instead of torch's CPU flash kernel.

Each step of the own decode loop (``decode_loop``) asks attention for one query token per row against that row's
KV cache. torch's CPU ``scaled_dot_product_attention`` runs its flash kernel for it, which is slow at this shape:
on an AMD EPYC (one thread) the tiny model's step attention over 256 rows x 35 keys took 1.0 ms per layer there
against 0.45 ms as softmax(q k^T) v with ``matmul``, and SmolLM2's (9 query heads over 3 KV heads, 128 rows x 60
keys) 3.0 against 1.8 ms. The gain is the kernel's: grouped-query heads are folded onto their KV head, as sdpa
also does for one-token queries, whereas transformers' own "eager" attention copies them (``repeat_kv``) and is
slower than sdpa for SmolLM2.

``single_query_attention_for(model)`` switches a supported sdpa model to this attention for the span of a decode
loop and back. The attention takes sdpa's masks (the same mask function is registered under its name) and hands
every call it does not serve (several query tokens, another device, a half-precision dtype, dropout, extra terms)
to transformers' sdpa attention; so a forward that began under either name stays valid under the other.
Its outputs equal sdpa's up to float rounding (a different summation order), a row with no key to attend included
(zeros, as sdpa gives).

Over a ``SharedPrefixCache`` (the decode loop's cache when its prompts were prefilled once), the keys and values it
is handed are the rows' suffixes only; it reads each prompt's keys once for all that prompt's rows and takes one
softmax over prompt and suffix, and a call it hands to sdpa gets the joined keys.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from comlrl_lab.models.scoring import base_model

NAME = "comlrl_single_query"

# Architectures whose attention goes only through transformers' attention interface, with no sdpa-specific branch
# in their modeling code (checked in transformers 5.24); others keep sdpa throughout.
MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "smollm3"})

#: The dtypes whose one-token steps ``single_query_attention`` computes itself; others go to sdpa.
SERVED_DTYPES = (torch.float32, torch.float64)

# Keywords that add a term to the scores; a call with any of them set goes to sdpa. (``sliding_window`` is not one:
# the mask already holds the window, and sdpa ignores the keyword too.)
_UNSERVED_KEYWORDS = ("position_bias", "softcap", "s_aux", "sinks")
# The major transformers release whose attention and mask interfaces were checked with this attention.
_CHECKED_TRANSFORMERS_MAJOR = 5


def _sdpa(*args: Any, **kwargs: Any) -> Any:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(*args, **kwargs)


def serves(
    query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float, **kwargs: Any
) -> bool:
    """Whether ``single_query_attention`` computes this call itself rather than handing it to sdpa."""
    return (
        query.shape[2] == 1
        and query.device.type == "cpu"
        and query.dtype in SERVED_DTYPES
        and not dropout
        and query.shape[0] == key.shape[0]
        and query.shape[1] % key.shape[1] == 0
        and (attention_mask is None or attention_mask.shape[1] == 1)  # one mask for all heads
        and all(kwargs.get(name) is None for name in _UNSERVED_KEYWORDS)
    )


def single_query_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface signature: query (B, H, 1, d), key/value (B, H_kv, L, d), and a mask
    broadcastable to (B, 1, 1, L): sdpa's boolean one (True = attend), an additive float one, or None (every key);
    returns ((B, 1, H, d), None).

    With the keyword ``shared_prefix`` (a ``SharedPrefixCache``, which the decode loop passes), key and value are
    only the rows' suffixes, and the L keys of the mask are the prompt's P followed by them.
    """
    shared_prefix = kwargs.pop("shared_prefix", None)
    if shared_prefix is not None:
        shared_prefix.attended()
    if not serves(query, key, attention_mask, dropout, **kwargs):
        if shared_prefix is not None:
            key, value = shared_prefix.joined_keys_values(module.layer_idx, key, value)
        return _sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    batch, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    scale = dim**-0.5 if scaling is None else scaling
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # each KV head's query heads as rows
    if shared_prefix is not None:
        output = _attend_shared_prefix(shared_prefix, module.layer_idx, grouped, key, value, attention_mask, scale)
    else:
        scores = torch.matmul(grouped, key.transpose(-1, -2)) * scale  # (B, H_kv, H / H_kv, L)
        output = torch.matmul(_masked_softmax(scores, attention_mask), value)  # (B, H_kv, H / H_kv, d)
    return output.reshape(batch, 1, heads, dim), None


def _masked_softmax(scores: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """softmax over the last dimension of ``scores`` with sdpa's mask applied as sdpa applies it."""
    blocked = None
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        blocked = ~attention_mask
        scores = scores.masked_fill(blocked, torch.finfo(scores.dtype).min)
    elif attention_mask is not None:
        scores = scores + attention_mask
    weights = scores.softmax(dim=-1)
    if blocked is not None:
        # A row with no key left would average every value; sdpa gives it zeros. Elsewhere a blocked key's weight
        # is already exactly 0 (exp underflows), so this changes nothing else.
        weights = weights.masked_fill(blocked, 0.0)
    return weights


def _attend_shared_prefix(
    cache: Any,
    layer_idx: int,
    grouped: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Attention of ``grouped`` (R, H_kv, H / H_kv, d) over each row's prompt in ``cache`` and its own suffix
    (key, value: (R, H_kv, S, d)), with one softmax over both; returns (R, H_kv, H / H_kv, d).

    A prompt's keys are read once for all its rows: its rows' queries become extra query rows of one product.
    """
    prefix_keys, prefix_values = cache.prefix(layer_idx)  # (U, H_kv, P, d)
    prompts, kv_heads, length, dim = prefix_keys.shape
    group = grouped.shape[2]
    per_prompt = cache.rows_per_prompt
    prompt, slot = cache.prompt_of_row, cache.slot_of_row  # (R,) each

    def by_prompt(rows: torch.Tensor) -> torch.Tensor:
        """(R, H_kv, group, n) -> (U, H_kv, rows_per_prompt * group, n), zero where a prompt has fewer rows."""
        blocks = rows.new_zeros((prompts, kv_heads, per_prompt, group, rows.shape[-1]))
        blocks[prompt, :, slot] = rows
        return blocks.reshape(prompts, kv_heads, per_prompt * group, rows.shape[-1])

    def by_row(blocks: torch.Tensor) -> torch.Tensor:
        return blocks.reshape(prompts, kv_heads, per_prompt, group, blocks.shape[-1])[prompt, :, slot]

    prefix_scores = by_row(torch.matmul(by_prompt(grouped), prefix_keys.transpose(-1, -2)))  # (R, H_kv, group, P)
    suffix_scores = torch.matmul(grouped, key.transpose(-1, -2))  # (R, H_kv, group, S)
    weights = _masked_softmax(torch.cat([prefix_scores, suffix_scores], dim=-1) * scale, attention_mask)
    prefix_output = by_row(torch.matmul(by_prompt(weights[..., :length]), prefix_values))
    return prefix_output + torch.matmul(weights[..., length:], value)


@functools.cache
def registered() -> bool:
    """Register the attention and sdpa's mask function under ``NAME`` with transformers, once; False where this
    transformers has no attention or mask interface to register with."""
    try:
        import transformers
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        return False
    if int(transformers.__version__.split(".")[0]) < _CHECKED_TRANSFORMERS_MAJOR:
        return False
    AttentionInterface.register(NAME, single_query_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return True


def applies_to(model: Any) -> bool:
    """Whether ``single_query_attention_for`` switches ``model``: sdpa attention, a listed architecture, the CPU."""
    base = base_model(model)
    config = getattr(base, "config", None)
    if (
        getattr(config, "_attn_implementation", None) != "sdpa"
        or getattr(config, "model_type", None) not in MODEL_TYPES
    ):
        return False
    parameter = next(iter(base.parameters()), None)
    return parameter is not None and parameter.device.type == "cpu"


@contextmanager
def single_query_attention_for(model: Any) -> Iterator[bool]:
    """Run ``model``'s attention through ``single_query_attention`` inside the block, then give it back its own.

    Yields whether it switched (not when the model is already switched: the outer block restores it). Only the
    config's attention name changes, and it is restored even when the block raises; transformers does not save
    that name with a config anyway. The name in place before is what comes back, so the model's attention must not
    be reconfigured (``set_attn_implementation``) while the block runs.
    """
    if not applies_to(model) or not registered():
        yield False
        return
    base = base_model(model)
    before = base.config._attn_implementation
    base.config._attn_implementation = NAME
    try:
        yield True
    finally:
        base.config._attn_implementation = before
