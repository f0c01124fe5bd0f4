"""Batched sampling of candidate responses: all prompts x candidates of a phase, for one agent's model.

Sequences are left-padded, sorted by prompt length so that a batch holds prompts of similar length, and sent
``settings.batch_size`` at a time (by default 64, more for row-seeded rows while a KV-cache budget allows,
``rows_per_call``) through ``model.generate`` (sampling, one beam, eval mode, no grad), or, for row-seeded sampling
of a plain model (a LoRA agent's too, through the model its peft wrapper wraps: ``lora_forward_model``), through our own
decode loop, which drops finished rows (``decode_loop``). Each completion is cut after its first EOS (the EOS is
kept) and comes back with its token ids, so that training can use exactly the tokens that were sampled.

Two ways to draw the randomness:

- a stream: the ``torch.Generator`` passed in drives the sampling and is advanced by it, and the device's global
  RNG is left as it was. Which tokens a row gets then depends on the rows sampled before it and beside it.
- per-row seeds (``row_seeds``): every (prompt, candidate) row draws its uniforms from its own seeded
  sequence, and a logits processor applies temperature, top-k and top-p and picks the token by inverse CDF;
  ``generate`` then runs greedily and takes that token. A row's tokens no longer depend on batch size, batch
  composition, sort order or which process sampled it, so sharding items across ranks changes nothing.

A model whose ``generate`` is replaced (its class's or instance's is not transformers' ``GenerationMixin.generate``,
``replaced_generate``) is sampled through it, as CoMLRL samples every candidate: with CoMLRL's sampling arguments,
one call per prompt with ``num_return_sequences`` when row-seeded (the device RNG seeded from the prompt's seed),
batched from the stream otherwise; none of our caches, processors or decode loop reach it (``_sample_custom``).

Within a generate call, each distinct prompt's KV cache (all its tokens but the last) is computed once and
shared by its candidates' rows (``SamplingSettings.prefill_once``); models without a ``logits_to_keep``/cache
forward are prefilled per row as before.

This module does not score, pair or train.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from comlrl_lab.models.decode_loop import decode_rows
from comlrl_lab.models.devices import model_device
from comlrl_lab.models.lora import lora_forward_model
from comlrl_lab.models.scoring import base_model, forward_parameters, set_mode

# Keys the sampler owns; extra generate kwargs may not override them.
_RESERVED_KWARGS = {"input_ids", "attention_mask", "num_return_sequences", "generator"}
# Sampling filters the per-row sampler does not apply itself; asking for them with row seeds is an error.
_ROW_SEEDED_UNSUPPORTED = {"min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "top_h", "logits_processor"}


@dataclass(frozen=True)
class SamplingSettings:
    """How candidates are sampled. Names and defaults follow CoMLRL's config fields; ``batch_size`` is ours."""

    max_new_tokens: int = 256
    temperature: float = 0.6
    top_p: float = 0.6
    top_k: int | None = 50  # passed to generate only when not None, as in CoMLRL
    # Sequences per call; None: 64, or for row-seeded sampling up to 256 within a KV-cache budget (``rows_per_call``).
    batch_size: int | None = None
    # Per-row sampling only: top-p over the top-k candidates (a partial sort) instead of a sort of the whole
    # vocabulary; the same kept set, so the same tokens. False runs transformers' warpers (the slow reference).
    top_k_first: bool = True
    # Run the forward over each distinct prompt of a generate call once and share its KV cache with the prompt's
    # candidates, instead of once per candidate. The same maths; the rounding of the first step may differ.
    prefill_once: bool = True
    # A ``current`` comparison (row-seeded) samples its current and comparator sides in one pass over the live
    # model (``sample_sides``): each prompt prefilled once for both, half the generate calls. The same tokens.
    sides_in_one_pass: bool = True
    # Row-seeded sampling runs its own decode loop (``decode_loop``) instead of ``generate`` where generate would
    # add nothing (no extra generate kwargs; a plain model, or the one a LoRA agent wraps: ``_decode_loop_cache_name``,
    # ``lora_forward_model``): finished rows leave the batch. The same tokens; a row's logits may round differently
    # with fewer rows beside it.
    own_decode_loop: bool = True
    # The own decode loop's one-token steps on the CPU compute attention as two batched matrix products instead of
    # torch's CPU flash kernel (``single_query_attention``). The same tokens up to the float rounding of the logits.
    single_query_attention: bool = True
    # With that attention, the decode loop keeps each distinct prompt's KV cache once instead of copying it into
    # every candidate's row (``SharedPrefixCache``), so a step concatenates only the tokens fed since. The same
    # tokens up to the float rounding of the logits.
    shared_prefix_attention: bool = True
    # The own decode loop sizes each KV cache layer for the whole call up front and writes each step's position into
    # it, instead of transformers' growth by concatenation, which copies the whole cache every step. The same tokens.
    preallocated_cache: bool = True
    # Called before every decode step and before every generate call; it raises to abandon the sampling (a stop the
    # user asked for), so a phase stops within a step instead of after a generate call that can take minutes on a
    # CPU. It does not change what is sampled.
    interrupt: Callable[[], None] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}.")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 (generation always samples), got {self.temperature!r}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}.")
        if self.top_k is not None and (
            isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0
        ):
            raise ValueError(f"top_k must be None or a non-negative integer, got {self.top_k!r}.")
        if self.batch_size is not None and (
            isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1
        ):
            raise ValueError(f"batch_size must be None or a positive integer, got {self.batch_size!r}.")


@dataclass(frozen=True)
class SampledText:
    """One sampled response. ``completion_ids`` has no padding and ends with the EOS when one was emitted."""

    text: str
    completion_ids: list[int]
    prompt_ids: list[int]
    finished: bool  # True when the response ended with an EOS token, False when it hit max_new_tokens


def count_tokens(samples: Sequence[Sequence[SampledText]]) -> int:
    """The number of generated tokens (EOS included, padding excluded) in ``sample_candidates`` output."""
    return sum(len(s.completion_ids) for row in samples for s in row)


# Device RNG -----------------------------------------------------------------------------------------------

_LOCKS: dict[str, threading.RLock] = {}
_LOCKS_GUARD = threading.Lock()


def _device_lock(device: torch.device) -> threading.RLock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(str(device), threading.RLock())


def _normalise(device: torch.device) -> torch.device:
    if device.type != "cpu" and device.index is None:
        module = getattr(torch, device.type)
        index = module.current_device() if hasattr(module, "current_device") else 0
        return torch.device(device.type, index)
    return device


def _get_rng_state(device: torch.device) -> torch.Tensor:
    if device.type == "cpu":
        return torch.get_rng_state()
    return getattr(torch, device.type).get_rng_state(device)


def _set_rng_state(device: torch.device, state: torch.Tensor) -> None:
    if device.type == "cpu":
        torch.set_rng_state(state)
    else:
        getattr(torch, device.type).set_rng_state(state, device)


@contextmanager
def generator_as_device_rng(generator: torch.Generator, device: torch.device) -> Iterator[None]:
    """Run the body with ``device``'s global RNG driven by ``generator``; restore the global RNG afterwards.

    ``model.generate`` takes no generator, so its sampling draws from the device's global RNG. When the
    generator lives on ``device`` its state is swapped in and the advanced state is written back, so the
    next call continues the stream. When it lives elsewhere, one 63-bit seed drawn from it seeds the device.
    Only ``device``'s state is touched (``torch.random.fork_rng`` would also save and restore the CPU state,
    which would clobber a CPU sampler running in another thread); a per-device lock keeps two samplers
    from swapping the same global state at once.
    """
    device = _normalise(torch.device(device))
    same_device = _normalise(generator.device) == device
    with _device_lock(device):
        saved = _get_rng_state(device)
        if same_device:
            _set_rng_state(device, generator.get_state())
        else:
            seed = int(torch.randint(0, 2**63 - 1, (1,), generator=generator, device=generator.device).item())
            seeded = torch.Generator(device=device)
            seeded.manual_seed(seed)
            _set_rng_state(device, seeded.get_state())
        try:
            yield
        finally:
            if same_device:
                generator.set_state(_get_rng_state(device))
            _set_rng_state(device, saved)


# Per-row seeded sampling ----------------------------------------------------------------------------------


def row_uniforms(row_seed: int, candidate: int, steps: int) -> np.ndarray:
    """``steps`` uniforms in (0, 1] for candidate ``candidate`` of a prompt whose seed is ``row_seed``.

    numpy's SeedSequence mixes (seed, candidate) into a PCG64 state, so rows are independent and a row's
    uniforms depend on nothing else. 1 - U moves the range from [0, 1) to (0, 1], which inverse-CDF sampling
    needs to never pick a zero-probability token.
    """
    seed = int(row_seed)
    entropy = [seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF, int(candidate)]
    return 1.0 - np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy))).random(steps)


class RowSeededSampler:
    """A ``generate`` logits processor that samples each row with its own uniforms and forces that token.

    Per step t: scores -> temperature -> top-k -> top-p (transformers' warpers' rules, in the order and with the
    ``min_tokens_to_keep=1`` that sampling with one beam uses), softmax in float32, then the token is the first
    index whose cumulative probability reaches u[b, t] times the total. Every other token gets -inf, so greedy
    decoding takes the sampled one. Each row's result depends only on its own logits and uniforms. ``choose`` picks
    the tokens alone, for the own decode loop.
    """

    def __init__(self, uniforms: torch.Tensor, settings: SamplingSettings):
        from transformers.generation.logits_process import (
            LogitsProcessorList,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        self.uniforms = uniforms  # (B, max_new_tokens) float32 on the model's device
        self.step = 0
        self.top_k = max(int(settings.top_k or 0), 0)
        self.top_p = float(settings.top_p)
        self.temperature = None
        if settings.temperature != 1.0:
            self.temperature = TemperatureLogitsWarper(settings.temperature)
        warpers = []
        if self.top_k:
            warpers.append(TopKLogitsWarper(top_k=self.top_k, min_tokens_to_keep=1))
        if self.top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=self.top_p, min_tokens_to_keep=1))
        self.warpers = LogitsProcessorList(warpers)
        self.top_k_first = settings.top_k_first and bool(self.top_k) and self.top_p < 1.0

    def filtered(self, scores: torch.Tensor) -> torch.Tensor:
        """``scores`` (R, V) after temperature, top-k and top-p, in float32: the tokens they remove at -inf."""
        scores = scores.float()
        if self.temperature is not None:
            scores = self.temperature(None, scores)
        if not self.top_k_first:
            return self.warpers(None, scores)
        filtered, tied = top_k_then_top_p(scores, self.top_k, self.top_p)
        if tied is not None:  # transformers' warpers filter each row on its own, so they run on the tied rows alone
            filtered[tied] = self.warpers(None, scores[tied])
        return filtered

    def choose(self, scores: torch.Tensor, rows: torch.Tensor | None, step: int) -> torch.Tensor:
        """The tokens (R,) that rows ``rows`` (indices into the batch; None: all) sample at ``step`` from their
        next-token ``scores`` (R, V)."""
        cdf = torch.softmax(self.filtered(scores), dim=-1).cumsum(dim=-1)  # (R, V)
        uniforms = self.uniforms if rows is None else self.uniforms[rows.to(self.uniforms.device)]
        u = uniforms[:, step].to(cdf.device) * cdf[:, -1]  # (R,)
        # First index with cdf >= u: u > 0, so that index has a positive probability.
        return (cdf < u.unsqueeze(1)).sum(dim=-1).clamp_(max=cdf.shape[-1] - 1)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        tokens = self.choose(scores, None, self.step)  # (B,)
        self.step += 1
        forced = torch.full_like(scores, float("-inf"), dtype=torch.float32)
        forced.scatter_(1, tokens.unsqueeze(1), 0.0)
        return forced


def top_k_then_top_p(scores: torch.Tensor, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Top-k then top-p filtering of ``scores`` (B, V) with one ``topk`` of k values instead of a sort of V.

    transformers' TopP warper sorts the whole vocabulary although top-k has already left k finite scores; the
    cumulative probabilities it compares with 1 - top_p are those of the kept k, in ascending order, which is
    what is computed here on the k values alone. Returns the filtered scores and the indices of the rows whose k-th
    score is tied with a score outside the top k (top-k then keeps more than k tokens), or None when no row is: the
    caller filters those rows with the full warpers instead.
    """
    k = min(top_k, scores.shape[-1])
    values, indices = torch.topk(scores, k, dim=-1)  # (B, k), descending
    kth = values[:, -1:]  # (B, 1)
    outside = scores < kth  # (B, V): what top-k removes
    tied = ((~outside).sum(dim=-1) > k).nonzero().squeeze(1)
    ascending, ascending_indices = values.flip(-1), indices.flip(-1)  # (B, k), as TopP sorts them
    cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - top_p)
    remove[:, -1] = False  # min_tokens_to_keep=1
    outside.scatter_(1, ascending_indices, remove)
    return scores.masked_fill(outside, float("-inf")), (tied if len(tied) else None)


def _row_sampler(batch: list[tuple[int, int]], seeds: Sequence[int], settings: SamplingSettings, device) -> Any:
    """The sampler of one batch of (prompt k, candidate j) rows, row b seeded with ``seeds[b]`` (its prompt's
    seed for its side)."""
    uniforms = np.stack([row_uniforms(seed, j, settings.max_new_tokens) for seed, (_, j) in zip(seeds, batch)])
    tensor = torch.from_numpy(uniforms.astype(np.float32)).to(device)  # (B, max_new_tokens)
    return RowSeededSampler(tensor, settings)


# Sampling -------------------------------------------------------------------------------------------------


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """The ids that end a response: the model's generation config, else the tokenizer's EOS."""
    generation_config = getattr(model, "generation_config", None)
    ids = getattr(generation_config, "eos_token_id", None)
    if ids is None:
        ids = tokenizer.eos_token_id
    if ids is None:
        return []
    return [int(i) for i in ids] if isinstance(ids, (list, tuple)) else [int(ids)]


def _left_pad(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)  # (B, T)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for b, row in enumerate(rows):
        if row:
            input_ids[b, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            attention_mask[b, width - len(row) :] = 1
    return input_ids.to(device), attention_mask.to(device)


def _cut_at_eos(ids: list[int], eos_ids: set[int]) -> tuple[list[int], bool]:
    for t, token in enumerate(ids):
        if token in eos_ids:
            return ids[: t + 1], True
    # No EOS: generation ran for max_new_tokens, and every token was sampled (even one equal to the pad id).
    return ids, False


def _store_samples(results, rows, generated, tokenizer, prompt_ids, eos_set: set[int]) -> None:
    """Cut each generated row after its first EOS, decode the rows in one call and file them as
    ``results[side][prompt][candidate]`` by ``rows``' (prompt, side, candidate) indices."""
    cut = [_cut_at_eos(row, eos_set) for row in generated]
    texts = tokenizer.batch_decode([ids for ids, _ in cut], skip_special_tokens=True)
    for (k, s, j), (ids, finished), text in zip(rows, cut, texts):
        results[s][k][j] = SampledText(text=text, completion_ids=ids, prompt_ids=list(prompt_ids[k]), finished=finished)


def _generate_kwargs(settings: SamplingSettings, pad_id: int, eos_ids: list[int], extra: Mapping[str, Any] | None):
    kwargs: dict[str, Any] = {
        "do_sample": True,
        "num_beams": 1,
        "max_new_tokens": settings.max_new_tokens,
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "pad_token_id": pad_id,
    }
    if settings.top_k is not None:
        kwargs["top_k"] = settings.top_k
    if eos_ids:
        kwargs["eos_token_id"] = eos_ids if len(eos_ids) > 1 else eos_ids[0]
    extra = dict(extra or {})
    extra.pop("do_sample", None)  # as in CoMLRL: generation always samples
    reserved = sorted(_RESERVED_KWARGS & set(extra))
    if reserved:
        raise ValueError(f"extra_generate_kwargs may not set {reserved}; the sampler controls them.")
    kwargs.update(extra)
    return kwargs


# Generation-config fields that add nothing to row-seeded sampling (the sampler sets or ignores them); any other
# field that differs from its default may add a logits processor or stopping rule, which only generate applies.
_PLAIN_GENERATION_FIELDS = {
    "_from_model_config",
    "bos_token_id",
    "do_sample",
    "eos_token_id",
    "max_length",
    "max_new_tokens",
    "num_beams",
    "output_attentions",
    "output_hidden_states",
    "pad_token_id",
    "temperature",
    "top_k",
    "top_p",
    "transformers_version",
    "use_cache",
}


def _plain_generation(model: Any) -> bool:
    """True when ``model``'s generation config asks ``generate`` for nothing the own decode loop leaves out."""
    generation_config = getattr(model, "generation_config", None)
    if generation_config is None or not hasattr(generation_config, "to_diff_dict"):
        return False
    return set(generation_config.to_diff_dict()) <= _PLAIN_GENERATION_FIELDS


def _with_interrupt(criteria: Any, interrupt: Callable[[], None]) -> Any:
    """``criteria`` (the caller's stopping criteria, or None) with a criterion that calls ``interrupt`` at every step
    of ``generate`` and never stops a row itself."""
    from transformers.generation.stopping_criteria import StoppingCriteria, StoppingCriteriaList

    class InterruptCheck(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            interrupt()
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([*(criteria or []), InterruptCheck()])


def _processors(sampler: RowSeededSampler) -> Any:
    """``sampler`` as the logits processor list ``generate`` takes."""
    from transformers.generation.logits_process import LogitsProcessorList

    return LogitsProcessorList([sampler])


# Rows per call when the settings leave it to the sampler (``batch_size=None``). Row-seeded rows share each step's
# fixed costs (on a CPU, most of a small model's step), so their calls grow from the former fixed 64 rows up to 256
# while the call's KV cache stays within a budget; never below 64, so no model samples in smaller calls than before.
# Stream sampling keeps 64: its tokens depend on the batching, and a run must sample as it did.
DEFAULT_ROWS_PER_CALL = 64
MOST_ROWS_PER_CALL = 256
KV_CACHE_BUDGET_BYTES = 1 << 30


def rows_per_call(model: Any, longest_prompt: int, max_new_tokens: int) -> int:
    """Rows per call of row-seeded sampling when ``SamplingSettings.batch_size`` is None: as many as keep the call's
    KV cache (keys and values of every layer over prompt and new tokens, in the model's dtype) within
    ``KV_CACHE_BUDGET_BYTES``, between ``DEFAULT_ROWS_PER_CALL`` and ``MOST_ROWS_PER_CALL``. Other memory of the
    call (prefill activations, the sampler's scores) is not counted."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True)
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None and heads and getattr(config, "hidden_size", None):
        head_dim = config.hidden_size // heads
    dtype = getattr(model, "dtype", None)
    if not (
        isinstance(layers, int)
        and isinstance(kv_heads, int)
        and isinstance(head_dim, int)
        and isinstance(dtype, torch.dtype)
    ):
        return DEFAULT_ROWS_PER_CALL
    per_row = 2 * layers * kv_heads * head_dim * (longest_prompt + max_new_tokens) * dtype.itemsize
    return max(DEFAULT_ROWS_PER_CALL, min(MOST_ROWS_PER_CALL, KV_CACHE_BUDGET_BYTES // max(per_row, 1)))


def _decode_loop_cache_name(model: Any) -> str | None:
    """The name under which the own decode loop passes ``model`` its cache, or None when the loop would not give
    ``model`` what ``generate`` would. It needs a model that generates with the default input preparation and a
    cache of plain full-attention layers, sdpa or eager attention, and a generation config that adds no processor
    or stopping rule."""
    from transformers import DynamicCache, GenerationMixin
    from transformers.cache_utils import DynamicLayer

    cache_name = _cache_argument(model)
    if cache_name is None or not _plain_generation(model):
        return None
    if getattr(model.config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return None
    if type(model).prepare_inputs_for_generation is not GenerationMixin.prepare_inputs_for_generation:
        return None  # the model prepares its own inputs (position resets, masks, extra tensors)
    if getattr(model, "is_remote_code", lambda: True)():
        return None
    plain = all(type(layer) is DynamicLayer for layer in DynamicCache(config=model.config).layers)
    return cache_name if plain else None


def _cache_argument(model: Any) -> str | None:
    """The name under which ``model`` takes a KV cache (``cache`` in transformers >= 5), or None (no sharing)."""
    parameters = forward_parameters(type(model))
    if "logits_to_keep" not in parameters:
        return None
    for name in ("cache", "past_key_values"):
        if name in parameters:
            return name
    return None


def _shared_prompt_cache(
    model: Any,
    cache_name: str,
    batch: list[tuple[int, int]],
    prompt_ids: list[list[int]],
    pad_id: int,
    device: torch.device,
) -> tuple[Any, torch.Tensor]:
    """The KV cache of every row's prompt but its last token, computed once per distinct prompt of ``batch``, and
    each batch row's index into it (B,).

    The distinct prompts are left-padded to the batch's width, so each cached row lines up with the batch rows
    of that prompt; ``generate`` then runs only each row's last prompt token before sampling. Positions count
    real tokens only, as ``generate`` counts them from the attention mask.
    """
    from transformers import DynamicCache

    distinct = list(dict.fromkeys(k for k, _ in batch))
    input_ids, attention_mask = _left_pad([prompt_ids[k] for k in distinct], pad_id, device)  # (U, T)
    position_ids = (attention_mask.cumsum(-1) - 1).masked_fill_(attention_mask == 0, 1)
    cache = DynamicCache(config=model.config)
    model(
        input_ids=input_ids[:, :-1],
        attention_mask=attention_mask[:, :-1],
        position_ids=position_ids[:, :-1],
        use_cache=True,
        logits_to_keep=1,
        **{cache_name: cache},
    )
    row_of = {k: u for u, k in enumerate(distinct)}
    return cache, torch.tensor([row_of[k] for k, _ in batch], device=device)  # (U, ...) rows, (B,)


def sample_candidates(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    num_candidates: int,
    settings: SamplingSettings,
    generator: torch.Generator | None,
    *,
    extra_generate_kwargs: Mapping[str, Any] | None = None,
    row_seeds: Sequence[int] | None = None,
) -> list[list[SampledText]]:
    """Sample ``num_candidates`` responses to every prompt; result[k][j] is candidate j of prompt k.

    Prompts are tokenised with the tokenizer's default special tokens and no chat template (as in CoMLRL).
    All prompts x candidates go through ``model.generate`` in batches of ``settings.batch_size``, shortest
    prompts first. The same generator state, inputs and settings give the same samples.

    With ``row_seeds`` (one seed per prompt) the generator is not used: candidate j of prompt k is sampled
    from ``row_uniforms(row_seeds[k], j, ...)``, whatever else is in its batch (``RowSeededSampler``).
    """
    _check_count(num_candidates)
    sides = [row_seeds] if row_seeds is not None else None
    return _sample(model, tokenizer, prompts, [num_candidates], settings, generator, extra_generate_kwargs, sides)[0]


def sample_sides(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    num_candidates: Sequence[int],
    settings: SamplingSettings,
    row_seeds: Sequence[Sequence[int]],
    *,
    extra_generate_kwargs: Mapping[str, Any] | None = None,
) -> list[list[list[SampledText]]]:
    """Several row-seeded sides over the same prompts in one pass; result[s][k][j] is side s's candidate j.

    Side s samples ``num_candidates[s]`` candidates per prompt from ``row_seeds[s]``, so each side gets the
    tokens that ``sample_candidates(..., num_candidates[s], row_seeds=row_seeds[s])`` gives it. A prompt's rows
    of every side sit next to each other, so its KV cache is prefilled once for all of them (``prefill_once``)
    and a ``current`` comparison samples both of its sides in one set of ``generate`` calls.
    """
    if len(num_candidates) != len(row_seeds):
        raise ValueError(f"one candidate count per side: got {len(num_candidates)} for {len(row_seeds)} sides.")
    for count in num_candidates:
        _check_count(count)
    return _sample(model, tokenizer, prompts, list(num_candidates), settings, None, extra_generate_kwargs, row_seeds)


def _check_count(num_candidates: Any) -> None:
    if isinstance(num_candidates, bool) or not isinstance(num_candidates, int) or num_candidates < 0:
        raise ValueError(f"num_candidates must be a non-negative integer, got {num_candidates!r}.")


def _sample(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    counts: list[int],
    settings: SamplingSettings,
    generator: torch.Generator | None,
    extra_generate_kwargs: Mapping[str, Any] | None,
    side_seeds: Sequence[Sequence[int]] | None,
) -> list[list[list[SampledText]]]:
    """result[s][k][j] for ``counts[s]`` candidates per prompt and side; row-seeded when ``side_seeds`` is given."""
    prompts = list(prompts)
    if not prompts or not any(counts):
        return [[[] for _ in prompts] for _ in counts]
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        raise ValueError("The tokenizer has no pad token; load it with comlrl_lab.models.loading.ensure_pad_token.")
    if side_seeds is not None:
        for seeds in side_seeds:
            if len(seeds) != len(prompts):
                raise ValueError(
                    f"row_seeds must have one seed per prompt: got {len(seeds)} for {len(prompts)} prompts."
                )
    elif generator is None:
        raise ValueError("sample_candidates needs a generator or row_seeds.")

    device = model_device(model)
    prompt_ids = [list(ids) for ids in tokenizer(prompts, truncation=True)["input_ids"]]
    empty = next((k for k, ids in enumerate(prompt_ids) if not ids), None)
    if empty is not None:  # else torch's "cannot reshape tensor of 0 elements" deep inside generate
        raise ValueError(
            f"prompt {empty} of {len(prompts)} ({prompts[empty]!r}) has no tokens (the tokenizer adds none of its "
            "own); a model needs at least one prompt token to sample from."
        )
    eos_ids = eos_token_ids(model, tokenizer)
    eos_set = set(eos_ids)
    kwargs = _generate_kwargs(settings, pad_id, eos_ids, extra_generate_kwargs)
    if replaced_generate(model) is not None:
        # Differs from our own paths, as CoMLRL does: a model whose generate is replaced samples through it.
        return _sample_custom(model, prompt_ids, counts, settings, generator, side_seeds, kwargs, tokenizer, eos_set)
    if settings.interrupt is not None:
        kwargs["stopping_criteria"] = _with_interrupt(kwargs.get("stopping_criteria"), settings.interrupt)
    if side_seeds is not None:
        unsupported = sorted(_ROW_SEEDED_UNSUPPORTED & set(kwargs))
        if unsupported:
            raise ValueError(f"per-row seeded sampling does not apply {unsupported}; leave them out.")
        # The processor samples; generate only takes its forced token (greedy, no warpers of its own).
        for key in ("temperature", "top_p", "top_k"):
            kwargs.pop(key, None)
        kwargs["do_sample"] = False
        if settings.top_k is None:
            # As when generate samples: top_k=None leaves the model's own generation_config top_k in force.
            inherited = getattr(getattr(model, "generation_config", None), "top_k", None)
            settings = dataclasses.replace(settings, top_k=inherited)

    # Every (prompt, side, candidate) job, shortest prompts first; a prompt's rows of all sides stay together.
    order = sorted(range(len(prompts)), key=lambda k: len(prompt_ids[k]))
    jobs = [(k, s, j) for k in order for s, count in enumerate(counts) for j in range(count)]
    results: list[list[list[Any]]] = [[[None] * count for _ in prompts] for count in counts]

    batch_size = settings.batch_size
    if batch_size is None and side_seeds is None:
        batch_size = DEFAULT_ROWS_PER_CALL
    elif batch_size is None:
        batch_size = rows_per_call(model, max(len(ids) for ids in prompt_ids), settings.max_new_tokens)
    # Differs from CoMLRL: a LoRA agent's prompts are prefilled once and it samples in our decode loop too, through
    # the model its peft wrapper generates with. Extra generate arguments may be peft's own (``adapter_names``),
    # which only its wrapper applies, so with any of them the wrapper samples, as before.
    decoder = model if extra_generate_kwargs else lora_forward_model(model)
    cache_name = _cache_argument(decoder) if settings.prefill_once else None
    loop_cache_name = None
    if side_seeds is not None and settings.own_decode_loop and not extra_generate_kwargs:
        loop_cache_name = _decode_loop_cache_name(decoder)
    was_training = model.training
    set_mode(model, False)  # dropout off while sampling
    try:
        rng_context = generator_as_device_rng(generator, device) if side_seeds is None else contextlib.nullcontext()
        with torch.inference_mode(), rng_context:
            for start in range(0, len(jobs), batch_size):
                if settings.interrupt is not None:
                    settings.interrupt()
                batch = jobs[start : start + batch_size]
                rows = [(k, j) for k, _, j in batch]
                input_ids, attention_mask = _left_pad([prompt_ids[k] for k, _ in rows], pad_id, device)
                sampler = None
                if side_seeds is not None:
                    sampler = _row_sampler(rows, [side_seeds[s][k] for k, s, _ in batch], settings, device)
                prefilled = prompt_of_row = None
                if cache_name and input_ids.shape[1] > 1 and len({k for k, _ in rows}) < len(rows):
                    prefilled, prompt_of_row = _shared_prompt_cache(
                        decoder, cache_name, rows, prompt_ids, pad_id, device
                    )
                if loop_cache_name and sampler is not None:
                    generated = decode_rows(
                        decoder,
                        loop_cache_name,
                        input_ids,
                        attention_mask,
                        sampler.choose,
                        settings.max_new_tokens,
                        eos_ids,
                        cache=prefilled,
                        single_query_attention=settings.single_query_attention,
                        prompt_of_row=prompt_of_row,
                        shared_prefix_attention=settings.shared_prefix_attention,
                        preallocated_cache=settings.preallocated_cache,
                        interrupt=settings.interrupt,
                    )
                else:
                    shared = {}
                    if prefilled is not None:
                        prefilled.batch_select_indices(prompt_of_row)  # one row per (prompt, candidate)
                        shared[cache_name] = prefilled
                    if sampler is not None:
                        kwargs["logits_processor"] = _processors(sampler)
                    output = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs, **shared)
                    sequences = output if isinstance(output, torch.Tensor) else output.sequences  # (B, T + new)
                    generated = sequences[:, input_ids.shape[1] :].tolist()
                _store_samples(results, batch, generated, tokenizer, prompt_ids, eos_set)
    finally:
        set_mode(model, was_training)
    return results


# A replaced generate ---------------------------------------------------------------------------------------


def replaced_generate(model: Any) -> str | None:
    """The qualified name of the ``generate`` that replaces transformers' ``GenerationMixin.generate`` on ``model``
    (set on its instance, or defined by its class or a base between it and ``GenerationMixin``), or None.

    A peft wrapper is looked through (its ``generate`` forwards to the wrapped model's), so a LoRA agent is judged by
    the model it wraps. A model without ``generate`` is not replaced. transformers' own classes that define their
    own ``generate`` count as replaced: our decode loop would not be theirs either.
    """
    from transformers import GenerationMixin

    inner = base_model(model)
    for candidate in dict.fromkeys((model, inner), None):
        own = vars(candidate).get("generate") if hasattr(candidate, "__dict__") else None
        if own is not None:
            return f"{type(candidate).__name__} instance's {getattr(own, '__qualname__', 'generate')}"
    method = getattr(type(inner), "generate", None)
    if method is None or method is GenerationMixin.generate:
        return None
    return getattr(method, "__qualname__", "generate")


def sampling_path(model: Any, settings: SamplingSettings, row_seeded: bool) -> str:
    """In words, the path by which ``sample_candidates`` samples ``model`` with ``settings`` (for the run's log):
    through the model's replaced ``generate``, our own decode loop, or transformers' ``generate``."""
    custom = replaced_generate(model)
    if custom is not None:
        how = "one call per prompt, seeded from the prompt's row seed" if row_seeded else "batched, from the stream"
        return f"its own generate ({custom}; {how})"
    if row_seeded and settings.own_decode_loop and _decode_loop_cache_name(lora_forward_model(model)) is not None:
        return "comlrl-lab's decode loop (row-seeded)"
    how = "row-seeded logits processor" if row_seeded else "from the stream"
    return f"transformers' generate ({how})"


def sampling_path_lines(models: Mapping[str, Any], settings: SamplingSettings, row_seeded: bool) -> list[str]:
    """One log line per named model ("agent 0", "comparator 1", ...): its class and the path that samples it."""
    return [
        f"sampling: {name} ({type(base_model(model)).__name__}) samples through {sampling_path(model, settings, row_seeded)}"
        for name, model in models.items()
    ]


def _sample_custom(
    model: Any,
    prompt_ids: list[list[int]],
    counts: list[int],
    settings: SamplingSettings,
    generator: torch.Generator | None,
    side_seeds: Sequence[Sequence[int]] | None,
    kwargs: dict[str, Any],
    tokenizer: Any,
    eos_set: set[int],
) -> list[list[list[SampledText]]]:
    """Sampling through a replaced ``generate``, with CoMLRL's keyword arguments (sampling, one beam, temperature,
    top-p, top-k) and no KV cache or logits processor of ours, which the replacement may not expect.

    Row-seeded: one call per (prompt, side) with ``num_return_sequences`` = the side's count, as CoMLRL calls it,
    the device RNG seeded from the prompt's row seed, so a prompt's candidates depend on its seed alone, not on the
    batching or the ranks (but on the count: candidate j is not drawn from a seed of its own).
    From a stream: the batched calls of transformers' path, the generator driving the device RNG.
    """
    device = model_device(model)
    results: list[list[list[Any]]] = [[[None] * count for _ in prompt_ids] for count in counts]
    # Each call: its (prompt k, side s, candidate j) rows, its random stream, the rows it asks for per prompt.
    if side_seeds is not None:
        calls = [
            ([(k, s, j) for j in range(count)], _seeded_generator(side_seeds[s][k]), count)
            for k in range(len(prompt_ids))
            for s, count in enumerate(counts)
            if count
        ]
    else:
        order = sorted(range(len(prompt_ids)), key=lambda k: len(prompt_ids[k]))
        jobs = [(k, s, j) for k in order for s, count in enumerate(counts) for j in range(count)]
        size = settings.batch_size or DEFAULT_ROWS_PER_CALL
        calls = [(jobs[start : start + size], generator, 1) for start in range(0, len(jobs), size)]
    was_training = model.training
    set_mode(model, False)
    try:
        with torch.inference_mode():
            for rows, rng, per_prompt in calls:
                if settings.interrupt is not None:  # a replaced generate may not take stopping criteria
                    settings.interrupt()
                prompts = [prompt_ids[k] for k, _, _ in rows[::per_prompt]]
                input_ids, attention_mask = _left_pad(prompts, kwargs["pad_token_id"], device)
                extra = {"return_dict_in_generate": True}  # CoMLRL's call; a tensor back is taken too
                if per_prompt > 1:
                    extra["num_return_sequences"] = per_prompt
                with generator_as_device_rng(rng, device):
                    output = model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs, **extra)
                sequences = output if isinstance(output, torch.Tensor) else output.sequences  # (rows, T + new)
                generated = sequences[:, input_ids.shape[1] :].tolist()
                _store_samples(results, rows, generated, tokenizer, prompt_ids, eos_set)
    finally:
        set_mode(model, was_training)
    return results


def _seeded_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded from a row seed (folded into torch's 64-bit seed range)."""
    generator = torch.Generator()
    generator.manual_seed(int(seed) % (1 << 63))
    return generator
