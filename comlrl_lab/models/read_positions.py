"""A decoder's last hidden states at chosen positions only, its last layer run just where they are read.

A reward model or a value head reads one hidden state per sequence (its last token's), yet a full forward runs the
last decoder layer's query projection, attention, output projection and MLP at every position. Only that layer's keys
and values are needed everywhere; the rest is needed at the read positions alone. ``hidden_states_at`` runs every
layer but the last as usual, then the last one at the read positions only: on the embedded tiny model (4 layers) a
Bradley-Terry step over a 130-token packed pair spends about a quarter of its time in the last layer.
``last_positions_logits`` does the same for the logits a scoring forward keeps (``scoring``: from the shortest
prompt's last position on), then applies the final norm and the LM head.

The same values up to float rounding (matrix products over fewer rows, another attention kernel). Served:
transformers' ``LlamaForCausalLM`` (SmolLM2 and the tiny model among them; transformers 5) with sdpa attention,
no attention dropout in play and no hook on its last layer (accelerate's offloading adds one), plain or in a peft LoRA
wrapper; any other model runs the full forward and is indexed at the positions, as before. The decoder is stopped
before its last layer by a pre-hook that acts only in the thread that placed it, so another thread's forward of the
same model runs whole.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from comlrl_lab.models.lora import lora_forward_model
from comlrl_lab.models.scoring import base_model, forward_parameters

# The major transformers release whose Llama layer ``_last_layer_at`` reproduces (checked in 5.25): pre-norm attention
# and MLP with residuals, rotary q/k from the decoder's position embeddings, no q/k norm, no sliding window, logits
# as lm_head(norm(h)).
_CHECKED_TRANSFORMERS_MAJOR = 5
# The attention implementation whose results the partial layer's sdpa call reproduces, gradients included (eager
# attention's differ from sdpa's with left padding in transformers 5.25, so an eager model keeps its full forward).
_SERVED_ATTENTION = frozenset({"sdpa"})


class _LastLayerInputs(Exception):
    """Raised by a pre-hook on the last decoder layer to stop the forward there and hand over its inputs."""

    def __init__(self, hidden_states: Tensor, attention_mask: Tensor | None, position_embeddings: Any):
        super().__init__("last decoder layer reached")
        self.hidden_states = hidden_states
        self.attention_mask = attention_mask
        self.position_embeddings = position_embeddings


@functools.lru_cache(maxsize=1)
def _checked_transformers() -> bool:
    import transformers

    return int(transformers.__version__.split(".")[0]) == _CHECKED_TRANSFORMERS_MAJOR


def _decoder_and_inner(backbone: Any) -> tuple[Any, Any]:
    """The decoder without the LM head, and the LM it belongs to (through a peft wrapper, the wrapped LM)."""
    inner = base_model(backbone)
    return getattr(inner, "base_model", inner), inner


def serves(backbone: Any) -> bool:
    """Whether ``hidden_states_at`` runs ``backbone``'s last layer at the read positions only: a transformers Llama
    causal LM, or one in a peft LoRA wrapper (calling it is calling that model). Any other wrapper (a reference with its
    adapters switched off, a prompt-learning adapter) may act around the call, so it is not served."""
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM

    if not _checked_transformers():
        return False
    inner = lora_forward_model(backbone)
    if type(inner) is not LlamaForCausalLM or base_model(backbone) is not inner:
        return False
    decoder, config = inner.model, inner.config
    if len(decoder.layers) != config.num_hidden_layers:
        return False
    last = decoder.layers[-1]
    attention = last.self_attn
    return (
        type(last) is LlamaDecoderLayer
        and type(attention) is LlamaAttention
        and config._attn_implementation in _SERVED_ATTENTION
        and not (attention.training and attention.attention_dropout > 0)
        and not getattr(config, "sliding_window", None)
        # The layer's and its attention's own forwards are never called here, so a hook on either (accelerate's
        # device placement, a user's) would be skipped; the projections, norms and MLP are called, hooks and all.
        and not any(
            module._forward_hooks or module._forward_pre_hooks or hasattr(module, "_hf_hook")
            for module in (last, attention)
        )
    )


def full_last_hidden(backbone: Any, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor | None) -> Tensor:
    """The last layer's hidden states (B, T, H) at every position, from the decoder without the LM head (or, for a
    model that is its own base model, from ``output_hidden_states``)."""
    decoder, inner = _decoder_and_inner(backbone)
    output = decoder(input_ids=input_ids, **_decoder_kwargs(decoder, inner, attention_mask, position_ids))
    return output.hidden_states[-1] if decoder is inner else output.last_hidden_state  # (B, T, H)


def _decoder_kwargs(decoder: Any, inner: Any, attention_mask: Tensor, position_ids: Tensor | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"attention_mask": attention_mask, "use_cache": False}
    if decoder is inner:
        kwargs["output_hidden_states"] = True
    if position_ids is not None and "position_ids" in forward_parameters(type(decoder)):
        kwargs["position_ids"] = position_ids
    return kwargs


def hidden_states_at(
    backbone: Any,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor | None,
    rows: Tensor,
    positions: Tensor,
    *,
    last_layer_at_read_positions: bool = True,
) -> Tensor:
    """The last hidden states (after the final norm) at ``(rows[n], positions[n])``, (N, H) in the model's dtype.

    ``attention_mask`` is the decoder's: (B, T) padding or a (B, 1, T, T) additive mask such as ``packing.pack_rows``
    makes. A served model (``serves``) runs its last layer at the N read positions only; others, and
    ``last_layer_at_read_positions=False``, run it everywhere and index the result.
    """
    if not (last_layer_at_read_positions and serves(backbone)):
        return full_last_hidden(backbone, input_ids, attention_mask, position_ids)[rows, positions]
    decoder, last, inputs = _run_to_last_layer(backbone, input_ids, attention_mask, position_ids)
    return decoder.norm(_last_layer_at(last, inputs, rows, positions[:, None]))[:, 0]


def last_positions_logits(
    model: Any, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor | None, keep: int
) -> Tensor:
    """The LM's logits (b, keep, V) at the last ``keep`` positions of every row, for a served model (``serves``):
    its last layer runs at those positions only, then the final norm and the LM head, as a forward with
    ``logits_to_keep=keep`` computes them."""
    decoder, last, inputs = _run_to_last_layer(model, input_ids, attention_mask, position_ids)
    rows, length = input_ids.shape
    positions = torch.arange(length - keep, length, device=input_ids.device).expand(rows, -1)  # (b, keep)
    hidden = decoder.norm(_last_layer_at(last, inputs, None, positions))  # (b, keep, H)
    return base_model(model).get_output_embeddings()(hidden)


def _run_to_last_layer(
    backbone: Any, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor | None
) -> tuple[Any, Any, _LastLayerInputs]:
    """Runs the decoder up to its last layer (a pre-hook stops it there); the decoder, that layer and its inputs."""
    decoder, inner = _decoder_and_inner(backbone)
    last = decoder.layers[-1]
    owner = threading.get_ident()

    def stop(_module: Any, args: tuple, kwargs: dict) -> None:
        if threading.get_ident() != owner:  # another thread's forward of the same model runs whole
            return
        hidden = args[0] if args else kwargs["hidden_states"]
        raise _LastLayerInputs(hidden, kwargs.get("attention_mask"), kwargs.get("position_embeddings"))

    handle = last.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        decoder(input_ids=input_ids, **_decoder_kwargs(decoder, inner, attention_mask, position_ids))
    except _LastLayerInputs as reached:
        reached.__traceback__ = None  # the decoder's frames need not outlive its forward
        return decoder, last, reached
    finally:
        handle.remove()
    raise RuntimeError(f"{type(decoder).__name__} never called its last layer")  # pragma: no cover


def _rotated(states: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding, (..., d) with cos/sin broadcast to it, as Llama's ``apply_rotary_pos_emb`` applies it to q
    and to k (here with cos/sin of their own positions each)."""
    from transformers.models.llama.modeling_llama import rotate_half

    return states * cos + rotate_half(states) * sin


def _query_mask(mask: Tensor | None, rows: Tensor | None, positions: Tensor, batch: int, keys: int) -> Tensor:
    """The layer mask at the queries, (b', 1 or heads, Q or 1, T): its own (boolean or additive, one row per query or
    one for all) or, for None, causal."""
    if mask is None:
        return (torch.arange(keys, device=positions.device) <= positions[..., None])[:, None]
    mask = mask.expand(batch, -1, -1, -1)
    if rows is not None:
        mask = mask[rows]
    if mask.shape[2] == 1:  # one mask row shared by every query
        return mask
    return mask.gather(2, positions[:, None, :, None].expand(-1, mask.shape[1], -1, mask.shape[3]))


def _last_layer_at(layer: Any, inputs: _LastLayerInputs, rows: Tensor | None, positions: Tensor) -> Tensor:
    """``LlamaDecoderLayer.forward`` at the queries only, (b', Q, H) before the decoder's final norm: query q of
    output row i sits at position ``positions[i, q]`` of input row ``rows[i]`` (of row i when ``rows`` is None)."""
    attention = layer.self_attn
    hidden = inputs.hidden_states  # (B, T, H)
    batch, keys, _ = hidden.shape
    head_dim = attention.head_dim
    normed = layer.input_layernorm(hidden)  # (B, T, H)
    cos, sin = (part.expand(batch, -1, -1) for part in inputs.position_embeddings)  # (B, T, d) each
    # Keys and values at every position, as the full layer has them; only the query rows' are attended to.
    key = attention.k_proj(normed).view(batch, keys, -1, head_dim).transpose(1, 2)  # (B, kv, T, d)
    value = attention.v_proj(normed).view(batch, keys, -1, head_dim).transpose(1, 2)
    key = _rotated(key, cos[:, None], sin[:, None])
    source = torch.arange(batch, device=positions.device) if rows is None else rows
    if rows is not None:
        key, value = key[rows], value[rows]  # (b', kv, T, d)
    at = (source[:, None], positions)  # (b', Q) each
    residual, cos_q, sin_q = hidden[at], cos[at], sin[at]  # (b', Q, ·)
    query = attention.q_proj(normed[at]).view(*positions.shape, -1, head_dim).transpose(1, 2)  # (b', heads, Q, d)
    query = _rotated(query, cos_q[:, None], sin_q[:, None])
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query heads, as transformers' repeat_kv (sdpa's enable_gqa needs torch 2.5)
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    attended = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=_query_mask(inputs.attention_mask, rows, positions, batch, keys),
        scale=attention.scaling,
    )  # (b', heads, Q, d)
    hidden_q = residual + attention.o_proj(attended.transpose(1, 2).reshape(*positions.shape, -1))  # (b', Q, H)
    return hidden_q + layer.mlp(layer.post_attention_layernorm(hidden_q))
