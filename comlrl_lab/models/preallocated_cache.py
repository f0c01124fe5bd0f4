"""KV cache layers that write each step's keys and values in place, into buffers sized once for the decode loop.

transformers' ``DynamicLayer`` grows by ``torch.cat``: every step copies the whole of every layer's keys and values
to append one position, so a call's copying grows with the square of its length. The decode loop knows the most
positions a call can reach (its prompt and ``max_new_tokens``), so ``preallocate`` gives each layer a buffer of that
many positions up front; a step writes its position into it and attention reads a view of the positions written.
The keys and values are the same numbers in the same layout along each row, so the logits are too.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


@functools.cache
def _layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    class PreallocatedLayer(DynamicLayer):
        """A ``DynamicLayer`` whose keys and values are views of (B, H_kv, capacity, d) buffers."""

        def __init__(self, capacity: int) -> None:
            super().__init__()
            self.capacity = capacity
            self.key_buffer: torch.Tensor | None = None
            self.value_buffer: torch.Tensor | None = None
            self.length = 0

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if end > self.capacity:
                raise RuntimeError(
                    f"a decode loop's KV cache was sized for {self.capacity} positions and was handed position {end}."
                )
            if self.key_buffer is None:
                self.key_buffer = key_states.new_empty((*key_states.shape[:2], self.capacity, key_states.shape[-1]))
                self.value_buffer = value_states.new_empty(
                    (*value_states.shape[:2], self.capacity, value_states.shape[-1])
                )
            self.key_buffer[:, :, self.length : end] = key_states
            self.value_buffer[:, :, self.length : end] = value_states
            self.length = end
            self._refresh_views()
            return self.keys, self.values

        def _refresh_views(self) -> None:
            self.keys = self.key_buffer[:, :, : self.length]
            self.values = self.value_buffer[:, :, : self.length]

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.key_buffer is not None:
                self.key_buffer = self.key_buffer[indices]
                self.value_buffer = self.value_buffer[indices]
                self._refresh_views()

        def _unsupported(self, *args: Any, **kwargs: Any) -> None:
            raise NotImplementedError("a preallocated decode-loop cache only grows and drops rows.")

        # These would rebind keys and values away from the buffers that the next update writes into.
        crop = batch_repeat_interleave = reorder_cache = reset = _unsupported

    return PreallocatedLayer


def preallocate(cache: Any, more_positions: int) -> None:
    """Give every layer of ``cache`` (a ``DynamicCache`` of plain ``DynamicLayer``s) a buffer for the positions it
    holds and ``more_positions`` more, keeping what it holds. Layers of any other kind are left as they are."""
    from transformers.cache_utils import DynamicLayer

    layer_class = _layer_class()
    for index, layer in enumerate(cache.layers):
        if type(layer) is not DynamicLayer:
            continue
        held = layer.get_seq_length()
        replacement = layer_class(held + more_positions)
        if held:
            replacement.update(layer.keys, layer.values)
        cache.layers[index] = replacement
