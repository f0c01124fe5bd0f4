"""A decode loop for row-seeded sampling that runs only the rows still generating.

``model.generate`` keeps every row of a batch in every step: a row that has emitted its EOS is fed pad tokens until
the longest row is done, and each step also pays for generate's logits processors, stopping criteria and
bookkeeping. With per-row seeds a row's tokens depend only on its own logits and uniforms, so a finished row can
leave the batch: its KV cache rows are dropped and the remaining rows carry on with the same inputs, positions and
mask they would have had. The tokens are the ones ``generate`` samples; only the float rounding of a row's logits
may differ, as matrix kernels may round differently with a different number of rows.

This module runs the model; choosing a token from the logits is the caller's (``choose``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from comlrl_lab.models.preallocated_cache import preallocate
from comlrl_lab.models.scoring import base_model
from comlrl_lab.models.shared_prefix_cache import shared_prefix_cache
from comlrl_lab.models.single_query_attention import SERVED_DTYPES, single_query_attention_for

# Finished rows leave the batch once they are at least this share of the rows fed: each drop copies the remaining
# rows' KV cache, so dropping one row at a time from a large batch would cost more than it saves.
DROP_SHARE = 0.125


def decode_rows(
    model: Any,
    cache_name: str,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    choose: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
    max_new_tokens: int,
    eos_ids: Sequence[int],
    cache: Any = None,
    single_query_attention: bool = True,
    prompt_of_row: torch.Tensor | None = None,
    shared_prefix_attention: bool = True,
    preallocated_cache: bool = True,
    interrupt: Callable[[], None] | None = None,
) -> list[list[int]]:
    """Sample up to ``max_new_tokens`` tokens for each left-padded row of ``input_ids`` (B, T).

    ``cache`` may hold the KV cache of every row's first T - k tokens (a shared prompt prefix); the loop's first
    forward runs the remaining k. ``choose(scores, rows, step)`` gets the float32 next-token scores (R, V) of the
    rows fed, their indices into the batch (R,) and the step, and returns their tokens (R,). Returns each row's
    sampled ids; a row that emitted an EOS may have tokens after it (sampled while it waited to leave the batch),
    which the caller cuts as it cuts the padding ``generate`` appends. ``single_query_attention`` runs the
    one-token steps' attention of a CPU sdpa model as two matrix products (``single_query_attention_for``).

    With ``prompt_of_row`` (B,), ``cache`` holds one row per distinct prompt instead, and row b continues prompt
    ``prompt_of_row[b]``. Where that attention runs and ``shared_prefix_attention`` is on, the prompts stay one
    row each (``SharedPrefixCache``); otherwise the cache is expanded to the B rows first.

    ``preallocated_cache`` sizes every layer's keys and values for the whole call before the first step, so that a
    step writes its position in place instead of copying the cache to append it (``preallocated_cache``).

    ``interrupt`` is called before every step; what it raises ends the call (a stop the user asked for).
    """
    from transformers import DynamicCache

    if prompt_of_row is not None and cache is None:
        raise ValueError("prompt_of_row names rows of a prefilled cache; no cache was given.")
    batch = input_ids.shape[0]
    device = input_ids.device
    if cache is None:
        cache = DynamicCache(config=model.config)
    mask = attention_mask
    # Positions count real tokens, as generate derives them from the mask.
    positions = (mask.long().cumsum(-1) - 1).masked_fill_(mask == 0, 0)
    rows = torch.arange(batch, device=device)  # row fed -> batch row
    eos = torch.tensor(sorted(set(eos_ids)), dtype=torch.long, device=device)
    generated: list[list[int]] = [[] for _ in range(batch)]
    finished = torch.zeros(batch, dtype=torch.bool, device=device)  # per row fed: has emitted an EOS
    attention = single_query_attention_for(model) if single_query_attention else contextlib.nullcontext(False)
    with attention as switched:
        shared = None
        if prompt_of_row is not None:
            # Half-precision steps go to sdpa, which would need the joined keys copied for every layer and step.
            served = cache.layers[0].keys.dtype in SERVED_DTYPES
            if switched and shared_prefix_attention and served:
                cache = shared = shared_prefix_cache(base_model(model).config, cache, prompt_of_row)
            else:
                cache.batch_select_indices(prompt_of_row)
        attention_kwargs = {} if shared is None else {"shared_prefix": shared}
        past = cache.get_seq_length()
        if preallocated_cache:
            preallocate(cache, input_ids.shape[1] - past + max_new_tokens)
        step_ids, step_positions = input_ids[:, past:], positions[:, past:]
        for step in range(max_new_tokens):
            if interrupt is not None:
                interrupt()
            output = model(
                input_ids=step_ids,
                attention_mask=mask,
                position_ids=step_positions,
                use_cache=True,
                logits_to_keep=1,
                **{cache_name: cache},
                **attention_kwargs,
            )
            if shared is not None:
                shared.check_attended()
            scores = output.logits[:, -1].to(dtype=torch.float32)  # (R, V)
            tokens = choose(scores, rows, step)  # (R,)
            for row, token in zip(rows.tolist(), tokens.tolist()):
                generated[row].append(token)
            if len(eos):
                finished |= torch.isin(tokens, eos)
            remaining = int((~finished).sum())
            if step + 1 == max_new_tokens or remaining == 0:
                break
            step_ids = tokens.unsqueeze(1)
            step_positions = step_positions[:, -1:] + 1
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)
            if len(rows) - remaining >= DROP_SHARE * len(rows):
                keep = (~finished).nonzero().squeeze(1)
                cache.batch_select_indices(keep)
                rows, mask, step_ids, step_positions = rows[keep], mask[keep], step_ids[keep], step_positions[keep]
                finished = finished[keep]
    return generated
