"""A decode loop's KV cache whose prompt part is held once per distinct prompt, not once per candidate row.

The sampler prefills each distinct prompt of a call once (``prefill_once``). Expanding that cache to one row per
(prompt, candidate) copies the prompt's keys and values into every candidate's row, and transformers'
``DynamicCache`` then copies the whole of every row again at each decode step, when it concatenates the step's
key and value onto it. On the tiny model's 256 rows that copying was about a sixth of the sampler's time.

``SharedPrefixCache`` keeps the prefilled prompts as they are, (U, H_kv, P, d) per layer, and stores per row only
the suffix (the tokens fed since), which grows as ``DynamicCache`` grows; its length counts both. The attention
that reads it is ``single_query_attention``, to which the model's forward hands the cache as the ``shared_prefix``
keyword. Every forward must reach that attention in every layer, or the suffix alone would be attended: the decode
loop checks it after each step (``check_attended``).
"""

from __future__ import annotations

import functools
from typing import Any

import torch


class SharedPrefixCache:
    """Built from a prefilled cache of U distinct prompts and each row's prompt index ``prompt_of_row`` (R,).

    A mixin over transformers' ``DynamicCache`` (``shared_prefix_cache`` makes the class), so the model finds the
    cache API it expects; ``update`` stores the suffix only.
    """

    def _init_shared_prefix(self, prefilled: Any, prompt_of_row: torch.Tensor) -> None:
        if any(getattr(layer, "is_sliding", False) for layer in prefilled.layers):
            raise ValueError("a shared prompt prefix needs full-attention cache layers; this cache has sliding ones.")
        self._prefix = [(layer.keys, layer.values) for layer in prefilled.layers]  # per layer (U, H_kv, P, d)
        self.prefix_length = prefilled.get_seq_length()
        self._attended = 0
        self._set_rows(prompt_of_row)

    def prefix(self, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer ``layer_idx``'s prompt keys and values, (U, H_kv, P, d) each."""
        return self._prefix[layer_idx]

    def _set_rows(self, prompt_of_row: torch.Tensor) -> None:
        """Each row's slot among its prompt's rows, so that a prompt's rows form one block of query rows."""
        self.prompt_of_row = prompt_of_row  # (R,)
        order = torch.argsort(prompt_of_row, stable=True)
        counts = torch.bincount(prompt_of_row, minlength=self._prefix[0][0].shape[0])
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
        """Keep the rows ``indices``; prompts none of them continues are dropped, so attention stops reading them."""
        super().batch_select_indices(indices)
        prompts, prompt_of_row = torch.unique(self.prompt_of_row[indices], return_inverse=True)
        if len(prompts) < self._prefix[0][0].shape[0]:
            self._prefix = [(keys[prompts], values[prompts]) for keys, values in self._prefix]
        self._set_rows(prompt_of_row)

    def joined_keys_values(
        self, layer_idx: int, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's prompt keys and values joined to its suffix ``key``/``value``: (R, H_kv, P + S, d) each."""
        prefix_keys, prefix_values = self._prefix[layer_idx]
        rows = self.prompt_of_row
        return torch.cat([prefix_keys[rows], key], dim=-2), torch.cat([prefix_values[rows], value], dim=-2)

    def attended(self) -> None:
        """Count one layer's attention over this cache (``single_query_attention`` calls it)."""
        self._attended += 1

    def check_attended(self) -> None:
        """After a forward: every layer must have attended over the prompt, or its output saw the suffix alone."""
        attended, self._attended = self._attended, 0
        if attended != len(self._prefix):
            raise RuntimeError(
                f"a forward over a shared prompt prefix reached its attention in {attended} of {len(self._prefix)} "
                "layers: the model's attention was changed during the decode loop, or it does not pass the "
                "shared_prefix keyword on."
            )

    def _unsupported(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("a shared-prefix cache only grows and drops rows in the decode loop.")

    # DynamicCache's other edits would change the suffix without the prompts, or the length without the keys.
    crop = batch_repeat_interleave = reorder_cache = reset = _unsupported


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
