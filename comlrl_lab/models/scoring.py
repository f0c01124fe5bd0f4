"""Log-probabilities of sampled completions under a causal LM, batched: the scoring core of MADPO and RL.

Each sequence is prompt ++ completion. Sequences are right-padded into micro-batches (longest first) and
run through one forward pass per micro-batch with an attention mask and explicit position ids. Token
log-probs are taken in float32 as logit[target] - logsumexp(logits), only at the positions that are scored,
so padding is never scored and the full (B, T, V) log-softmax is never materialised. Logits are asked for from
the shortest prompt's last position on only; a Llama decoder runs its last layer there only too
(``read_positions``), the same values up to float rounding.

Gradients flow when the caller has them enabled; wrap calls in ``torch.no_grad()`` for detached margins.
This module does not switch the model's mode: see ``disable_dropout`` for scoring without dropout noise.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from comlrl_lab.models.devices import model_device
from comlrl_lab.models.packing import group_by_key, micro_batches, pack_rows, within_row_budget


def base_model(model: Any) -> Any:
    """The model a peft wrapper wraps (``get_base_model``), or ``model`` itself: its class and config are the real ones."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


@functools.lru_cache(maxsize=64)
def forward_parameters(model_class: type) -> frozenset[str]:
    """The keyword names ``model_class.forward`` takes, read from its signature once per class."""
    return frozenset(inspect.signature(model_class.forward).parameters)


def disable_dropout(model: Any) -> Any:
    """Set every dropout probability in ``model`` to 0, keeping train mode (and gradient checkpointing).

    Covers ``nn.Dropout`` modules and the float ``attention_dropout`` attribute Hugging Face attention
    modules pass to their attention kernels.
    """
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0
    return model


def set_mode(model: Any, training: bool) -> None:
    """``model.train(training)`` only when the model is not in that mode already.

    ``train()``/``eval()`` walk every submodule; called per update and per generate call they cost about half a
    millisecond each on the tiny model. Modes are only ever set on the root here, so its flag speaks for the tree.
    """
    if model.training != training:
        model.train(training)


def scored_token_counts(completion_ids: Sequence[Sequence[int]], score_final_token: bool) -> list[int]:
    """How many tokens of each completion ``sequence_logps`` scores."""
    if score_final_token:
        return [len(c) for c in completion_ids]
    # CoMLRL's decentralized convention (seed page): the last completion token is not scored.
    return [max(len(c) - 1, 0) for c in completion_ids]


def _logits_to_keep(model: Any, keep: int) -> dict[str, int]:
    """The keyword asking ``model`` for the logits of its last ``keep`` positions only, where its forward takes one
    (a peft model forwards it to its base model, so the base is asked)."""
    params = forward_parameters(type(base_model(model)))
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in params:
            return {name: keep}
    return {}


def _target_logps(
    logits: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """log p(targets[n] | the logits at (rows[n], positions[n])), (N,), normalised in float32 or wider, so bf16 and
    fp16 logits are not normalised in half precision; a float64 model stays float64."""
    selected = logits[rows, positions].to(torch.promote_types(logits.dtype, torch.float32))  # (N, V)
    return selected.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(selected, dim=-1)


def _last_logits(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, keep: int
) -> torch.Tensor:
    """The logits (b, T', V) of the last T' positions, T' = ``keep`` where the model can be asked for fewer than all.

    A Llama decoder (``read_positions.serves``) runs its last layer at those positions only; any other model is
    asked for them with ``logits_to_keep``. ``position_ids`` go in where the model takes them."""
    from comlrl_lab.models.read_positions import last_positions_logits, serves  # read_positions imports this module

    if keep < input_ids.shape[1] and serves(model):
        return last_positions_logits(model, input_ids, attention_mask, position_ids, keep)
    kwargs: dict[str, Any] = {"attention_mask": attention_mask, "use_cache": False, **_logits_to_keep(model, keep)}
    # A peft model forwards these keywords to its base model; ask the base which ones it takes.
    if "position_ids" in forward_parameters(type(base_model(model))):
        kwargs["position_ids"] = position_ids
    return model(input_ids=input_ids, **kwargs).logits


def _score_rows(
    model: Any,
    prompts: list[list[int]],
    completions: list[list[int]],
    counts: list[int],
    pad_token_id: int,
    device: torch.device,
) -> torch.Tensor:
    """Token log-probs (float32 or wider, (b, max count)) of completions[b][:counts[b]], zero past each count (all > 0)."""
    width = max(counts)
    rows = len(prompts)
    # Scoring completion tokens 0..n-1 needs the logits at positions P-1 .. P+n-2, i.e. inputs up to P+n-2.
    inputs = [p + c[: max(n - 1, 0)] for p, c, n in zip(prompts, completions, counts)]
    seq_len = max(len(x) for x in inputs)
    input_ids = torch.full((rows, seq_len), pad_token_id, dtype=torch.long)  # (b, T), right padding
    attention_mask = torch.zeros((rows, seq_len), dtype=torch.long)
    for b, x in enumerate(inputs):
        input_ids[b, : len(x)] = torch.tensor(x, dtype=torch.long)
        attention_mask[b, : len(x)] = 1

    # Only positions from the shortest prompt onwards carry scored logits.
    first = min(len(p) - 1 for p in prompts)
    position_ids = torch.arange(seq_len, device=device).unsqueeze(0).expand(rows, -1)
    logits = _last_logits(
        model, input_ids.to(device), attention_mask.to(device), position_ids, seq_len - first
    )  # (b, T', V), T' = T - offset
    offset = seq_len - logits.shape[1]

    row_index, token_index, position, target = [], [], [], []
    for b, (p, c, n) in enumerate(zip(prompts, completions, counts)):
        row_index += [b] * n
        token_index += range(n)
        position += range(len(p) - 1 - offset, len(p) - 1 - offset + n)
        target += c[:n]
    row_index_t = torch.tensor(row_index, device=device)
    token_logps = _target_logps(
        logits, row_index_t, torch.tensor(position, device=device), torch.tensor(target, device=device)
    )  # (N,), N = scored tokens
    out = torch.zeros((rows, width), dtype=token_logps.dtype, device=device)
    return out.index_put((row_index_t, torch.tensor(token_index, device=device)), token_logps)  # (b, width)


def _score(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    score_final_token: bool,
    micro_batch_size: int,
    packed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token_logps, mask), both (B, C_max) aligned with completion_ids; mask marks the scored tokens.

    With ``packed`` (and a model that takes custom masks) the completions that share a prompt are scored from one
    row, the prompt run once (``_score_packed``); at most ``micro_batch_size`` completions go into a forward.
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions.")
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be a positive integer, got {micro_batch_size!r}.")
    if pad_token_id is None:
        raise ValueError("pad_token_id is required to pad micro-batches.")
    prompts = [list(map(int, p)) for p in prompt_ids]
    completions = [list(map(int, c)) for c in completion_ids]
    counts = scored_token_counts(completions, score_final_token)
    for b, (p, n) in enumerate(zip(prompts, counts)):
        if n > 0 and not p:
            raise ValueError(f"prompt_ids[{b}] is empty: the first completion token has no context to be scored from.")

    device = model_device(model)
    c_max = max((len(c) for c in completions), default=0)
    token_logps = torch.zeros((len(completions), c_max), dtype=torch.float32, device=device)  # (B, C_max)
    if packed and supports_packed_pairs(model):
        token_logps = _score_packed(
            model, prompts, completions, counts, int(pad_token_id), micro_batch_size, token_logps
        )
        return token_logps, _scored_mask(counts, c_max).to(device)
    # Rows with something to score, longest first, so each micro-batch holds similar lengths (little padding).
    order = sorted((b for b, n in enumerate(counts) if n > 0), key=lambda b: len(prompts[b]) + counts[b], reverse=True)
    if order:
        parts = []
        for start in range(0, len(order), micro_batch_size):
            chunk = order[start : start + micro_batch_size]
            part = _score_rows(
                model,
                [prompts[b] for b in chunk],
                [completions[b] for b in chunk],
                [counts[b] for b in chunk],
                int(pad_token_id),
                device,
            )
            parts.append(F.pad(part, (0, c_max - part.shape[1])))
        token_logps = token_logps.to(parts[0].dtype).index_put((torch.tensor(order, device=device),), torch.cat(parts))
    return token_logps, _scored_mask(counts, c_max).to(device)


def _scored_mask(counts: list[int], width: int) -> torch.Tensor:
    """(B, width) True at each completion's scored tokens: the first ``counts[b]``."""
    return torch.arange(width).unsqueeze(0) < torch.tensor(counts, dtype=torch.long).reshape(-1, 1)


def sequence_logps(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    score_final_token: bool = False,
    micro_batch_size: int = 16,
    return_token_logps: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed log π(completion | prompt) per sequence, float32 (float64 for a float64 model), (B,), on its device.

    ``score_final_token=False`` (default) follows CoMLRL's documented decentralized convention: the last
    completion token is not scored. ``True`` scores every completion token, including the EOS that ended
    it. A completion with nothing to score gets 0.0. Completions are the sampled token ids without padding;
    ``pad_token_id`` only fills the micro-batches. Gradients flow unless the caller disables them.
    With ``return_token_logps`` it returns ``(logps, token_logps, mask)``, the last two (B, C_max).
    """
    # Differs from CoMLRL: one padded forward per micro-batch instead of one batch-1 forward per sequence; the
    # completion is never cut at the first pad id (so with pad == eos the EOS stays a real token); log-softmax
    # runs in float32 or wider whatever the model dtype; the mode (dropout) is left to the caller.
    token_logps, mask = _score(
        model,
        prompt_ids,
        completion_ids,
        pad_token_id=pad_token_id,
        score_final_token=score_final_token,
        micro_batch_size=micro_batch_size,
    )
    logps = token_logps.sum(dim=-1)  # (B,)
    if torch.is_grad_enabled() and not logps.requires_grad:
        # Nothing was scored: a constant that backward() accepts (as CoMLRL returns for empty completions).
        logps.requires_grad_(True)
    if return_token_logps:
        return logps, token_logps, mask
    return logps


def token_logps_and_mask(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    micro_batch_size: int = 16,
    packed: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-probs of every completion token and the mask of real tokens, both (B, C_max).

    For policy-gradient losses: every sampled token, EOS included, is scored, and padding is masked out. With
    ``packed``, completions after the same prompt share one row (the prompt runs once): the same log-probs up to
    float rounding, where the model takes custom masks (``supports_packed_pairs``).
    """
    # Differs from CoMLRL: its MAGRPO-family loss scores trailing padding and skips the last real token.
    return _score(
        model,
        prompt_ids,
        completion_ids,
        pad_token_id=pad_token_id,
        score_final_token=True,
        micro_batch_size=micro_batch_size,
        packed=packed,
    )


def supports_packed_pairs(model: Any) -> bool:
    """Whether ``model`` takes a custom 4D additive attention mask and position ids (sdpa or eager attention), and
    attends over whole sequences: a custom mask replaces a sliding window's, so models with one score unpacked."""
    base = base_model(model)
    config = getattr(base, "config", None)
    implementation = getattr(config, "_attn_implementation", None)
    sliding = any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or ()) or (
        getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
    )
    return implementation in ("sdpa", "eager") and not sliding and "position_ids" in forward_parameters(type(base))


def _packed_branch_logps(
    model: Any,
    prompts: list[list[int]],
    branches: list[list[list[int]]],
    counts: list[list[int]],
    pad_token_id: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token log-probs of each branch after its row's prompt, from one packed row per prompt.

    Row r is ``[prompts[r] | branch 1 inputs | branch 2 inputs | ...]`` (``packing.pack_rows``): each branch sees the
    prompt and itself, never another branch, and restarts its positions where the prompt ends, so each token's
    logits are those of its own unpacked sequence; the prompt runs once. Every branch's first token is scored from
    the prompt's last position. Returns ``(token_logps, row, branch, token)``, each (N,) over the N scored tokens in
    row-major, branch, token order.
    """
    inputs = [[c[: max(n - 1, 0)] for c, n in zip(row, row_counts)] for row, row_counts in zip(branches, counts)]
    packed = pack_rows(prompts, inputs, pad_token_id=pad_token_id, dtype=next(model.parameters()).dtype)
    seq_len = packed.input_ids.shape[1]
    first = min(len(p) - 1 for p in prompts)
    logits = _last_logits(
        model,
        packed.input_ids.to(device),
        packed.attention_mask.to(device),
        packed.position_ids.to(device),
        seq_len - first,
    )  # (b, T', V)
    offset = seq_len - logits.shape[1]

    row_index, position, target, branch_index, token_index = [], [], [], [], []
    for r, (p, row, row_counts, starts) in enumerate(zip(prompts, branches, counts, packed.branch_starts)):
        for j, (c, n, begin) in enumerate(zip(row, row_counts, starts)):
            if n == 0:
                continue
            row_index += [r] * n
            position += [len(p) - 1 - offset] + list(range(begin - offset, begin - offset + n - 1))
            target += c[:n]
            branch_index += [j] * n
            token_index += range(n)
    out_dtype = torch.promote_types(logits.dtype, torch.float32)
    as_tensor = functools.partial(torch.tensor, dtype=torch.long, device=device)
    if not target:
        empty = as_tensor([])
        return torch.zeros(0, dtype=out_dtype, device=device), empty, empty, empty
    row_t = as_tensor(row_index)
    token_logps = _target_logps(logits, row_t, as_tensor(position), as_tensor(target))  # (N,)
    return token_logps, row_t, as_tensor(branch_index), as_tensor(token_index)


def _packed_pair_rows(
    model: Any,
    prompts: list[list[int]],
    winners: list[list[int]],
    losers: list[list[int]],
    winner_counts: list[int],
    loser_counts: list[int],
    pad_token_id: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probs of winners and losers, (b,) each, from one row per pair: [prompt | winner | loser]."""
    b = len(prompts)
    token_logps, row, side, _ = _packed_branch_logps(
        model,
        prompts,
        [[w, lo] for w, lo in zip(winners, losers)],
        [[nw, nl] for nw, nl in zip(winner_counts, loser_counts)],
        pad_token_id,
        device,
    )
    sums = torch.zeros((2 * b,), dtype=token_logps.dtype, device=device)
    if not len(token_logps):
        return sums[:b], sums[b:]
    sums = sums.index_add(0, row + b * side, token_logps)
    return sums[:b], sums[b:]


def _score_packed(
    model: Any,
    prompts: list[list[int]],
    completions: list[list[int]],
    counts: list[int],
    pad_token_id: int,
    micro_batch_size: int,
    token_logps: torch.Tensor,
) -> torch.Tensor:
    """``token_logps`` (B, C_max) filled in: the completions after one prompt are scored from one packed row (several
    where the row would pass ``packing.MAX_PACKED_ROW_TOKENS``), at most ``micro_batch_size`` completions a forward."""
    device = token_logps.device
    scored = [b for b, n in enumerate(counts) if n > 0]
    groups = []
    for group in group_by_key([tuple(prompts[b]) for b in scored], micro_batch_size):
        members = [scored[i] for i in group]
        runs = within_row_budget(len(prompts[members[0]]), [counts[b] - 1 for b in members])
        groups += [[members[i] for i in run] for run in runs]
    # Longest rows first, so each micro-batch holds similar lengths (little padding).
    groups.sort(key=lambda g: len(prompts[g[0]]) + sum(counts[b] for b in g), reverse=True)
    for batch in micro_batches(groups, micro_batch_size):
        logps, row, branch, token = _packed_branch_logps(
            model,
            [prompts[g[0]] for g in batch],
            [[completions[b] for b in g] for g in batch],
            [[counts[b] for b in g] for g in batch],
            pad_token_id,
            device,
        )
        sequence = torch.tensor([b for g in batch for b in g], dtype=torch.long, device=device)
        first_of_row = torch.tensor([0] + [len(g) for g in batch][:-1], device=device).cumsum(0)
        token_logps = token_logps.to(logps.dtype).index_put((sequence[first_of_row[row] + branch], token), logps)
    return token_logps


def pair_logps(
    model: Any,
    prompt_ids: Sequence[Sequence[int]],
    winner_ids: Sequence[Sequence[int]],
    loser_ids: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    score_final_token: bool = False,
    micro_batch_size: int = 16,
    packed: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sequence_logps`` of each pair's winner and of its loser after the same prompt: (B,) each.

    With ``packed`` (and a model that takes custom masks, ``supports_packed_pairs``) each pair is one row
    ``[prompt | winner | loser]`` with a block-causal mask, so the prompt runs once per pair instead of twice:
    the same log-probs up to float rounding. Otherwise winners and losers are scored as ``sequence_logps`` does.
    """
    size = len(prompt_ids)
    if not (len(winner_ids) == len(loser_ids) == size):
        raise ValueError(f"{size} prompts, {len(winner_ids)} winners and {len(loser_ids)} losers.")
    if not packed or not supports_packed_pairs(model) or size == 0:
        logps = sequence_logps(
            model,
            list(prompt_ids) + list(prompt_ids),
            list(winner_ids) + list(loser_ids),
            pad_token_id=pad_token_id,
            score_final_token=score_final_token,
            micro_batch_size=2 * micro_batch_size,
        )
        return logps[:size], logps[size:]
    prompts = [list(map(int, p)) for p in prompt_ids]
    winners = [list(map(int, c)) for c in winner_ids]
    losers = [list(map(int, c)) for c in loser_ids]
    winner_counts = scored_token_counts(winners, score_final_token)
    loser_counts = scored_token_counts(losers, score_final_token)
    for b, p in enumerate(prompts):
        if (winner_counts[b] or loser_counts[b]) and not p:
            raise ValueError(f"prompt_ids[{b}] is empty: the first completion token has no context to be scored from.")
    device = model_device(model)
    # Longest rows first, so each micro-batch holds similar lengths (little padding).
    order = sorted(range(size), key=lambda b: len(prompts[b]) + winner_counts[b] + loser_counts[b], reverse=True)
    order = [b for b in order if prompts[b]]
    winner_parts, loser_parts = [], []
    for start in range(0, len(order), micro_batch_size):
        chunk = order[start : start + micro_batch_size]
        w, lo = _packed_pair_rows(
            model,
            [prompts[b] for b in chunk],
            [winners[b] for b in chunk],
            [losers[b] for b in chunk],
            [winner_counts[b] for b in chunk],
            [loser_counts[b] for b in chunk],
            int(pad_token_id),
            device,
        )
        winner_parts.append(w)
        loser_parts.append(lo)
    index = torch.tensor(order, device=device)
    dtype = winner_parts[0].dtype if winner_parts else torch.float32
    winner_logps = torch.zeros(size, dtype=dtype, device=device)
    loser_logps = torch.zeros(size, dtype=dtype, device=device)
    if winner_parts:
        winner_logps = winner_logps.index_put((index,), torch.cat(winner_parts))
        loser_logps = loser_logps.index_put((index,), torch.cat(loser_parts))
    if torch.is_grad_enabled() and not winner_logps.requires_grad:
        winner_logps.requires_grad_(True)
        loser_logps.requires_grad_(True)
    return winner_logps, loser_logps
