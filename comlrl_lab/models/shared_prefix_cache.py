"""A decode loop's KV cache whose prompt part is held once per distinct prompt, not once per candidate row.

The sampler prefills each distinct prompt of a call once (``prefill_once``). Expanding that cache to one row per
(prompt, candidate) copies the prompt's keys and values into every candidate's row, and transformers'
``DynamicCache`` then copies the whole of every row again at each decode step, when it concatenates the step's
key and value onto it. For the tiny model's 256 rows x 4 layers that concatenation was about a third of a decode
step on the development machine (torch profiler), and it grows with the prompt.

``SharedPrefixCache`` keeps the prefilled prompts as they are, (U, H_kv, P, d) per layer, and a per-row suffix
(the tokens fed since) that grows as ``DynamicCache`` grows. Its attention (``attend``) scores each row's one query
against its prompt's keys through one batched product per prompt group (a group's candidate rows become extra query
rows of that prompt), against its own suffix keys directly, and takes one softmax over both parts, so the weights
are those of attention over the joined keys up to float rounding (the same sums in another order). The model's
forward passes the cache to ``single_query_attention`` as the ``shared_prefix`` keyword, which transformers hands
through to the attention function unchanged.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


def _prefix_layers(prefilled: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in prefilled.layers]


class SharedPrefixCache:
    """Built from a prefilled cache of U distinct prompts and each row's prompt index ``prompt_of_row`` (R,).

    Mixed into transformers' ``DynamicCache`` by ``shared_prefix_cache`` (so the model sees the cache API it
    expects); ``update`` stores the suffix only, and the sequence length it reports covers prompt and suffix.
    """

    def _init_shared_prefix(self, prefilled: Any, prompt_of_row: torch.Tensor) -> None:
        self.prefix = _prefix_layers(prefilled)  # per layer: (U, H_kv, P, d) keys and values
        self.prefix_length = prefilled.get_seq_length()
        self._set_rows(prompt_of_row)

    def _set_rows(self, prompt_of_row: torch.Tensor) -> None:
        """Each row's slot among its prompt's rows, so a prompt's rows form one block of query rows."""
        self.prompt_of_row = prompt_of_row  # (R,)
        order = torch.argsort(prompt_of_row, stable=True)
        counts = torch.bincount(prompt_of_row, minlength=self.prefix[0][0].shape[0])
        starts = torch.cumsum(counts, 0) - counts
        slot = torch.empty_like(prompt_of_row)
        slot[order] = torch.arange(len(prompt_of_row), device=prompt_of_row.device) - starts[prompt_of_row[order]]
        self.slot_of_row = slot  # (R,)
        self.rows_per_prompt = int(counts.max()) if len(prompt_of_row) else 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.prefix_length + super().get_seq_length(layer_idx)

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        return self.get_seq_length(layer_idx) + query_length, 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        super().batch_select_indices(indices)
        self._set_rows(self.prompt_of_row[indices])

    def full_keys_values(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor):
        """The joined (R, H_kv, P + S, d) keys and values, for a call ``attend`` does not serve."""
        prefix_keys, prefix_values = self.prefix[layer_idx]
        rows = self.prompt_of_row
        return (
            torch.cat([prefix_keys[rows], key], dim=-2),
            torch.cat([prefix_values[rows], value], dim=-2),
        )

    def attend(
        self,
        layer_idx: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scale: float,
    ) -> torch.Tensor:
        """softmax(q [K_prompt | K_suffix]^T * scale + mask) [V_prompt | V_suffix] for one query token per row.

        query (R, H, 1, d); key/value the suffix (R, H_kv, S, d); the mask as ``single_query_attention`` takes it,
        over P + S keys. Returns (R, H_kv, H / H_kv, d).
        """
        prefix_keys, prefix_values = self.prefix[layer_idx]  # (U, H_kv, P, d)
        rows, heads, _, dim = query.shape
        prompts, kv_heads, length, _ = prefix_keys.shape
        group = heads // kv_heads
        per_prompt = self.rows_per_prompt
        prompt, slot = self.prompt_of_row, self.slot_of_row
        queries = query.reshape(rows, kv_heads, group, dim)
        # Each prompt's rows as query rows of that prompt: (U, H_kv, rows_per_prompt, group, d), zero where empty.
        blocks = queries.new_zeros((prompts, kv_heads, per_prompt, group, dim))
        blocks[prompt, :, slot] = queries
        blocks = blocks.reshape(prompts, kv_heads, per_prompt * group, dim)
        prefix_scores = torch.matmul(blocks, prefix_keys.transpose(-1, -2))  # (U, H_kv, rows_per_prompt * group, P)
        prefix_scores = prefix_scores.reshape(prompts, kv_heads, per_prompt, group, length)[prompt, :, slot]
        suffix_scores = torch.matmul(queries, key.transpose(-1, -2))  # (R, H_kv, group, S)
        scores = torch.cat([prefix_scores, suffix_scores], dim=-1) * scale  # (R, H_kv, group, P + S)
        blocked = None
        if attention_mask is not None and attention_mask.dtype == torch.bool:
            blocked = ~attention_mask
            scores = scores.masked_fill(blocked, torch.finfo(scores.dtype).min)
        elif attention_mask is not None:
            scores = scores + attention_mask
        weights = scores.softmax(dim=-1)
        if blocked is not None:
            weights = weights.masked_fill(blocked, 0.0)
        weight_blocks = weights.new_zeros((prompts, kv_heads, per_prompt, group, length))
        weight_blocks[prompt, :, slot] = weights[..., :length]
        weight_blocks = weight_blocks.reshape(prompts, kv_heads, per_prompt * group, length)
        prefix_out = torch.matmul(weight_blocks, prefix_values)  # (U, H_kv, rows_per_prompt * group, d)
        prefix_out = prefix_out.reshape(prompts, kv_heads, per_prompt, group, dim)[prompt, :, slot]
        return prefix_out + torch.matmul(weights[..., length:], value)  # (R, H_kv, group, d)


@functools.cache
def _cache_class() -> type:
    from transformers import DynamicCache

    return type("SharedPrefixDynamicCache", (SharedPrefixCache, DynamicCache), {})


def shared_prefix_cache(config: Any, prefilled: Any, prompt_of_row: torch.Tensor) -> Any:
    """A ``DynamicCache`` (for the model ``config``) with the ``SharedPrefixCache`` behaviour, over ``prefilled``'s U
    prompts (left-padded to one width) and the rows ``prompt_of_row`` (R,) that continue them; its suffix starts
    empty."""
    cache = _cache_class()(config=config)
    cache._init_shared_prefix(prefilled, prompt_of_row)
    return cache
