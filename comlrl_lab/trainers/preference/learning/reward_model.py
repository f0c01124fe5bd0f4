"""MARLHF's learned oracle: a scalar head on a causal LM, the joint reward model, and Bradley-Terry fitting.

``ScalarHeadLM`` runs a causal-LM backbone *without* its vocabulary projection and applies a scalar head to
the hidden state of the last non-padding token (left or right padding, with position ids taken from the
attention mask so both give the same score). ``JointRewardModel`` reads every agent's prompt and response as
one text, in CoMLRL's layout; critics and value heads of ``policy_learning`` reuse the same pooling.
``fit_bradley_terry`` fits a reward model on preference pairs with -log σ(R(w) - R(l)) and returns loss,
accuracy and mean margin per epoch, on the training pairs and a held-out slice.

It does not decide which pairs to fit on or when (``marlhf.py``), and never scores evaluation samples.

Deliberate deviations from CoMLRL (each also in docs/differences_from_comlrl.md):
- no LM head and no all-layer hidden states are computed just to pool one vector;
- winners and losers of a batch go through one padded forward, not two; with ``packed`` (``pack_pair_scoring``),
  the tokens a pair's two joint texts share (the header and agent 1's prompt; later agents' prompts follow a
  response, so they differ) run once in one row, and so do those of an item's candidates when they are scored;
- the head runs in float32 whatever the backbone dtype, and is initialised from a seeded stream;
- loss, accuracy and margin are reported per epoch, on held-out pairs too (CoMLRL logs nothing).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from comlrl_lab.models.packing import group_by_key, micro_batches, pack_rows, shared_prefix_length, within_row_budget
from comlrl_lab.models.read_positions import hidden_states_at
from comlrl_lab.models.reward_oracle import joint_reward_text
from comlrl_lab.models.scoring import supports_packed_pairs
from comlrl_lab.names import metric_names as M
from comlrl_lab.trainers.preference.learning.losses import NonFiniteLossError, bradley_terry_loss, check_finite
from comlrl_lab.trainers.preference.learning.optim import build_adamw
from comlrl_lab.trainers.preference.runtime.distributed import DistContext


# ------------------------------------------------------------------------------------------------ pooling
def last_token_index(attention_mask: Tensor) -> Tensor:
    """Index of the largest position whose mask is 1, per row: (B, T) -> (B,). Left or right padding alike.

    A row with no real token gets index 0.
    """
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)  # (T,)
    return (attention_mask.long() * positions).argmax(dim=-1)  # (B,)


def mask_position_ids(attention_mask: Tensor) -> Tensor:
    """Position ids that count real tokens only (0 for the first real token), so left padding shifts nothing."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)  # (B, T)


def pooled_hidden(
    backbone: Any, input_ids: Tensor, attention_mask: Tensor, *, last_layer_at_read_positions: bool = True
) -> Tensor:
    """Last-layer hidden state at each row's last non-padding token, float32, (B, T) -> (B, H).

    ``last_layer_at_read_positions``: see ``read_positions.hidden_states_at``."""
    # Differs from CoMLRL: it runs the full LM (vocabulary logits included) with every layer's hidden states; here
    # the decoder runs without its LM head, and its last layer only where the hidden state is read.
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    return hidden_states_at(
        backbone,
        input_ids,
        attention_mask,
        mask_position_ids(attention_mask),
        rows,
        last_token_index(attention_mask).to(input_ids.device),
        last_layer_at_read_positions=last_layer_at_read_positions,
    ).float()  # (B, H)


def packed_pooled_hidden(
    backbone: Any,
    groups: Sequence[Sequence[Sequence[int]]],
    pad_token_id: int,
    *,
    last_layer_at_read_positions: bool = True,
) -> Tensor:
    """The pooled hidden state (float32, (N, H)) of every sequence of ``groups``, in order, one packed row per group.

    A group's longest shared token prefix runs once, each sequence's rest after it with a block-causal mask
    (``packing.pack_rows``), so each sequence's last hidden state is its unpacked one up to float rounding. A group
    whose row would pass ``packing.MAX_PACKED_ROW_TOKENS`` takes several rows, each with the prefix.
    """
    prefixes, branches = [], []
    for group in groups:
        if any(len(sequence) == 0 for sequence in group):
            raise ValueError("An empty token sequence has no last token to score.")
        shared = shared_prefix_length(group)
        for run in within_row_budget(shared, [len(sequence) - shared for sequence in group]):
            prefixes.append(list(group[0][:shared]))
            branches.append([list(group[i][shared:]) for i in run])
    weight = next(backbone.parameters())
    packed = pack_rows(prefixes, branches, pad_token_id=pad_token_id, dtype=weight.dtype)
    device = weight.device
    rows = [r for r, row in enumerate(branches) for _ in row]
    ends = [
        start + len(branch) - 1
        for row, starts in zip(branches, packed.branch_starts)
        for branch, start in zip(row, starts)
    ]
    return hidden_states_at(
        backbone,
        packed.input_ids.to(device),
        packed.attention_mask.to(device),
        packed.position_ids.to(device),
        torch.tensor(rows, device=device),
        torch.tensor(ends, device=device),
        last_layer_at_read_positions=last_layer_at_read_positions,
    ).float()  # (N, H)


def hidden_size(backbone: Any) -> int:
    config = getattr(backbone, "config", None)
    for name in ("hidden_size", "n_embd", "d_model"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise ValueError("Cannot infer the backbone's hidden size (config has no hidden_size, n_embd or d_model).")


# ------------------------------------------------------------------------------------------------- heads
def scalar_head(
    width: int,
    hidden_dim: int | None = None,
    *,
    generator: torch.Generator | None = None,
    init: str = "linear_default",
) -> nn.Module:
    """A float32 head (H,) -> scalar: Linear, or Linear-Tanh-Linear with ``hidden_dim``.

    ``init="linear_default"`` draws weights and biases from U(-1/√fan_in, 1/√fan_in) (torch's Linear default,
    CoMLRL's reward head); ``"normal"`` uses N(0, 0.02) weights and zero biases (CoMLRL's value heads). The
    draws come from ``generator``, never from torch's global RNG.
    """
    if hidden_dim is None:
        head: nn.Module = nn.Linear(width, 1)
    else:
        if isinstance(hidden_dim, bool) or not isinstance(hidden_dim, int) or hidden_dim < 1:
            raise ValueError(f"value head hidden_dim must be a positive integer or None, got {hidden_dim!r}.")
        head = nn.Sequential(nn.Linear(width, hidden_dim), nn.Tanh(), nn.Linear(hidden_dim, 1))
    with torch.no_grad():
        for layer in head.modules():
            if not isinstance(layer, nn.Linear):
                continue
            if init == "normal":
                layer.weight.normal_(0.0, 0.02, generator=generator)
                layer.bias.zero_()
            elif init == "linear_default":
                bound = 1.0 / math.sqrt(layer.in_features)
                layer.weight.uniform_(-bound, bound, generator=generator)
                layer.bias.uniform_(-bound, bound, generator=generator)
            else:
                raise ValueError(f"unknown head init {init!r}")
    return head.float()


class ScalarHeadLM(nn.Module):
    """A causal-LM backbone plus a scalar head on its last non-padding hidden state: text -> one float.

    ``forward(input_ids, attention_mask) -> (B,)`` float32. ``score_texts`` tokenises (``truncation=True``,
    ``max_length``), pads and scores in micro-batches. The backbone's LM head is never run.
    """

    def __init__(
        self,
        backbone: Any,
        tokenizer: Any,
        head: nn.Module,
        *,
        max_length: int | None = None,
        packed: bool = False,
        last_layer_at_read_positions: bool = True,
    ):
        super().__init__()
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.head = head.to(self.device)
        self.max_length = max_length
        # Texts that share a token prefix (a pair's joint prompt, an item's candidates) run it once, in one packed
        # row, where the backbone takes custom masks.
        self.packed = bool(packed) and supports_packed_pairs(backbone)
        # Where served (``read_positions``), the backbone's last layer runs at the pooled tokens only; False runs it
        # everywhere (what ``benchmarks/reward_fit.py`` compares against).
        self.last_layer_at_read_positions = bool(last_layer_at_read_positions)

    @property
    def device(self) -> torch.device:
        return next(self.backbone.parameters()).device

    def freeze_backbone(self) -> None:
        for parameter in self.backbone.parameters():
            parameter.requires_grad_(False)

    def trainable_parameters(self) -> list[nn.Parameter]:
        # The LM head (when untied) gets no gradient from pooled scores; AdamW skips grad-less parameters anyway.
        return [p for p in self.parameters() if p.requires_grad]

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        # Differs from CoMLRL: the head runs in float32 (CoMLRL casts it to the backbone dtype, bf16 on GPUs).
        pooled = pooled_hidden(
            self.backbone, input_ids, attention_mask, last_layer_at_read_positions=self.last_layer_at_read_positions
        )  # (B, H) float32
        return self.head(pooled).squeeze(-1)  # (B,)

    def encode(self, texts: Sequence[str]) -> tuple[Tensor, Tensor]:
        """Token ids and attention mask (B, T) on the model's device; the tokenizer's padding side is kept."""
        kwargs: dict[str, Any] = {"padding": True, "truncation": True, "return_tensors": "pt"}
        if self.max_length is not None:
            kwargs["max_length"] = int(self.max_length)
        encoded = self.tokenizer(list(texts), **kwargs)
        return encoded["input_ids"].to(self.device), encoded["attention_mask"].to(self.device)

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, truncated as ``encode`` truncates them, unpadded (``score_ids`` pads)."""
        kwargs: dict[str, Any] = {"truncation": True}
        if self.max_length is not None:
            kwargs["max_length"] = int(self.max_length)
        return [list(ids) for ids in self.tokenizer(list(texts), **kwargs)["input_ids"]]

    def score_ids(self, rows: Sequence[Sequence[int]]) -> Tensor:
        """Scores (B,) of tokenised texts in one forward, padded as ``encode`` pads them (the tokenizer's side)."""
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), int(self.tokenizer.pad_token_id), dtype=torch.long)  # (B, T)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        left = getattr(self.tokenizer, "padding_side", "right") == "left"
        for b, row in enumerate(rows):
            span = slice(width - len(row), width) if left else slice(0, len(row))
            input_ids[b, span] = torch.tensor(list(row), dtype=torch.long)
            attention_mask[b, span] = 1
        return self(input_ids.to(self.device), attention_mask.to(self.device))

    def score_groups(self, groups: Sequence[Sequence[Sequence[int]]]) -> Tensor:
        """Scores (N,) of every tokenised text of ``groups``, in order, in one forward: each group is one packed row
        whose shared token prefix runs once (``packed_pooled_hidden``)."""
        pooled = packed_pooled_hidden(
            self.backbone,
            groups,
            int(self.tokenizer.pad_token_id),
            last_layer_at_read_positions=self.last_layer_at_read_positions,
        )  # (N, H)
        return self.head(pooled).squeeze(-1)

    def score_texts(self, texts: Sequence[str], *, micro_batch_size: int = 32) -> Tensor:
        """Scores (B,) float32 on the model's device; gradients flow when enabled by the caller."""
        texts = list(texts)
        if not texts:
            return torch.zeros(0, device=self.device)
        parts = []
        for start in range(0, len(texts), max(1, int(micro_batch_size))):
            input_ids, attention_mask = self.encode(texts[start : start + micro_batch_size])
            parts.append(self(input_ids, attention_mask))
        return torch.cat(parts)


class JointRewardModel(ScalarHeadLM):
    """R(joint response): every agent's prompt and response as one text, scored by a scalar head.

    Text layout (1-based agents, blocks joined by a blank line), as CoMLRL writes it::

        Joint multi-agent response

        Agent 1 prompt:
        <prompt 1>

        Agent 1 response:
        <response 1>
        ...
    """

    @staticmethod
    def joint_text(prompts: Sequence[str], completions: Sequence[str]) -> str:
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions in one joint response.")
        return joint_reward_text(prompts, completions)

    @classmethod
    def from_backbone(
        cls,
        backbone: Any,
        tokenizer: Any,
        *,
        generator: torch.Generator | None = None,
        max_length: int | None = None,
        freeze_backbone: bool = False,
        packed: bool = False,
        last_layer_at_read_positions: bool = True,
    ) -> JointRewardModel:
        """Wrap a loaded causal LM with a freshly initialised Linear head (seeded by ``generator``)."""
        head = scalar_head(hidden_size(backbone), generator=generator)
        model = cls(
            backbone,
            tokenizer,
            head,
            max_length=max_length,
            packed=packed,
            last_layer_at_read_positions=last_layer_at_read_positions,
        )
        if freeze_backbone:
            model.freeze_backbone()
        return model

    def score_joint(
        self, prompts: Sequence[Sequence[str]], completions: Sequence[Sequence[str]], *, micro_batch_size: int = 32
    ) -> list[float]:
        """Frozen scores of joint responses (``prompts[j]``, ``completions[j]`` per joint response j)."""
        texts = [self.joint_text(p, c) for p, c in zip(prompts, completions)]
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                if self.packed and texts:
                    # Differs from CoMLRL: an item's candidates share one row, their common first tokens run once.
                    scores = self._score_by_prompts(texts, [tuple(p) for p in prompts], micro_batch_size)
                else:
                    scores = self.score_texts(texts, micro_batch_size=micro_batch_size)
        finally:
            self.train(was_training)
        return [float(s) for s in scores.cpu()]

    def _score_by_prompts(self, texts: list[str], keys: list[tuple[str, ...]], micro_batch_size: int) -> Tensor:
        """Scores (B,) of ``texts``, those with the same prompts (``keys``) packed into one row per micro-batch."""
        ids = self.tokenize(texts)
        groups = group_by_key(keys, micro_batch_size)
        scores = torch.zeros(len(texts), device=self.device)
        for batch in micro_batches(groups, micro_batch_size):
            index = torch.tensor([i for group in batch for i in group], device=self.device)
            scores[index] = self.score_groups([[ids[i] for i in group] for group in batch])
        return scores

    def score_candidates(self, candidates: Sequence[Any], *, micro_batch_size: int = 32) -> list[float]:
        """Scores of ``JointCandidate``s (their ``prompts`` and ``completions``): the MARLHF oracle."""
        return self.score_joint(
            [c.prompts for c in candidates], [c.completions for c in candidates], micro_batch_size=micro_batch_size
        )


# ----------------------------------------------------------------------------------------- Bradley-Terry
def split_validation(
    count: int, fraction: float, rng: random.Random, keys: Sequence[Any] | None = None
) -> tuple[list[int], list[int]]:
    """Hold out about round(fraction · count) of ``range(count)`` (>= 1 when fraction > 0, always leaving one for
    training), chosen with ``rng``. Returns (train indices, validation indices), each sorted.

    With ``keys``, indices sharing a key (the same pair drawn twice by the replay sampler) stay on one side,
    so the held-out pairs are never also training pairs.
    """
    if not 0 <= fraction < 1:
        raise ValueError(f"validation fraction must be in [0, 1), got {fraction!r}.")
    keys = list(range(count)) if keys is None else list(keys)
    groups: dict[Any, list[int]] = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    order = list(groups.values())
    rng.shuffle(order)
    target = min(count - 1, max(1, round(fraction * count))) if fraction > 0 and len(order) >= 2 else 0
    held: list[int] = []
    while order and len(held) < target and len(order) > 1:
        held += order.pop()
    return sorted(i for group in order for i in group), sorted(held)


def _bt_batch(
    model: ScalarHeadLM, winners: list[list[int]], losers: list[list[int]], micro: int
) -> tuple[Tensor, Tensor]:
    """Winner and loser scores (b,) each; winners and losers share one padded forward per micro-batch of pairs."""
    w_parts, l_parts = [], []
    for start in range(0, len(winners), micro):
        w, lo = winners[start : start + micro], losers[start : start + micro]
        # Differs from CoMLRL: winners and losers go through one forward, not two separate ones; packed, each pair
        # is one row whose shared first tokens run once.
        if getattr(model, "packed", False):
            scores = model.score_groups([[a, b] for a, b in zip(w, lo)])  # (2b,): w0, l0, w1, l1, ...
            w_parts.append(scores[0::2])
            l_parts.append(scores[1::2])
            continue
        scores = model.score_ids(w + lo)  # (2b,)
        w_parts.append(scores[: len(w)])
        l_parts.append(scores[len(w) :])
    return torch.cat(w_parts), torch.cat(l_parts)


def _tokenize_pairs(model: ScalarHeadLM, pairs: Sequence[tuple[str, str]]) -> list[tuple[list[int], list[int]]]:
    """Each (winner, loser) text pair as token ids, every distinct text tokenised once for the whole fit."""
    texts = list(dict.fromkeys(text for pair in pairs for text in pair))
    ids = dict(zip(texts, model.tokenize(texts))) if texts else {}
    return [(ids[w], ids[lo]) for w, lo in pairs]


def evaluate_bradley_terry(
    model: ScalarHeadLM,
    pairs: Sequence[tuple[str, str]],
    *,
    micro_batch_size: int = 16,
    token_ids: Sequence[tuple[list[int], list[int]]] | None = None,
    dist: DistContext | None = None,
) -> dict[str, float]:
    """Loss, accuracy (share with R(w) > R(l)) and mean margin R(w) - R(l) of frozen scores; NaN with no pairs.

    ``token_ids`` (the pairs already tokenised, as ``fit_bradley_terry`` keeps them) skips the tokenizer. With
    several ranks (``dist``) each scores a strided share and the means are taken over all of them.
    """
    pairs = _tokenize_pairs(model, pairs) if token_ids is None else list(token_ids)
    if not pairs:
        return {"loss": math.nan, "accuracy": math.nan, "margin": math.nan}
    dist = dist if dist is not None else DistContext()
    local = dist.shard(pairs)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            if local:
                winners, losers = _bt_batch(model, [w for w, _ in local], [lo for _, lo in local], micro_batch_size)
                loss, accuracy, margin = bradley_terry_loss(winners, losers)
                values = [float(loss), float(accuracy), float(margin)]
            else:
                values = [0.0, 0.0, 0.0]
    finally:
        model.train(was_training)
    if dist.enabled:
        sums = dist.all_reduce_sum([v * len(local) for v in values])
        values = [v / len(pairs) for v in sums]
    return dict(zip(("loss", "accuracy", "margin"), values))


def fit_bradley_terry(
    model: ScalarHeadLM,
    train_pairs: Sequence[tuple[str, str]],
    val_pairs: Sequence[tuple[str, str]] = (),
    *,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    rng: random.Random,
    micro_batch_size: int = 16,
    dropout: bool = False,
    max_grad_norm: float | None = None,
    on_batch: Callable[[], None] | None = None,
    adamw_implementation: str = "fused",
    dist: DistContext | None = None,
) -> list[dict[str, float]]:
    """Fit ``model`` on (winner text, loser text) pairs with L = -mean log σ(R(w) - R(l)); AdamW, ``epochs`` passes.

    Each epoch shuffles the pairs with ``rng`` and takes one optimiser step per ``batch_size`` pairs, winners
    and losers scored in one forward per ``micro_batch_size`` pairs (gradients accumulate across micro-batches).
    Returns one dict per epoch: ``bt/loss``, ``bt/accuracy``, ``bt/margin`` (means over the epoch's batches,
    measured before each step) and ``bt/val_loss``, ``bt/val_accuracy``, ``bt/val_margin`` (after the epoch, on
    ``val_pairs``; NaN without them). The model is left in eval mode. ``dropout=False`` trains without dropout
    noise (the config's ``disable_dropout``).

    Under torchrun (``dist`` with several ranks) every rank fits the same model: each scores a strided slice of
    every batch, weighted by slice / batch, and the gradients are summed before the step, so each step is the one
    a single process takes on the whole batch; the held-out pairs are split the same way.
    """
    # Differs from CoMLRL: it logs nothing about the fit; these metrics and the held-out slice are ours.
    dist = dist if dist is not None else DistContext()
    # Tokenised once for every epoch and the validation passes, not once per optimiser step.
    train_pairs = _tokenize_pairs(model, train_pairs)
    val_ids = _tokenize_pairs(model, val_pairs)
    optimizer = build_adamw(model.trainable_parameters(), learning_rate, adamw_implementation)
    history: list[dict[str, float]] = []
    micro = max(1, int(micro_batch_size))
    for epoch in range(1, int(epochs) + 1):
        order = list(train_pairs)
        rng.shuffle(order)
        sums = {"loss": 0.0, "accuracy": 0.0, "margin": 0.0}
        model.train(dropout)
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            local = dist.shard(batch)
            optimizer.zero_grad(set_to_none=True)
            failure = None
            try:
                for m_start in range(0, len(local), micro):
                    chunk = local[m_start : m_start + micro]
                    winners, losers = _bt_batch(model, [w for w, _ in chunk], [lo for _, lo in chunk], micro)
                    loss, accuracy, margin = bradley_terry_loss(winners, losers)
                    check_finite(loss, f"Bradley-Terry loss (epoch {epoch})")
                    (loss * (len(chunk) / len(batch))).backward()
                    sums["loss"] += float(loss.detach()) * len(chunk)
                    sums["accuracy"] += float(accuracy) * len(chunk)
                    sums["margin"] += float(margin) * len(chunk)
            except NonFiniteLossError as error:
                if not dist.enabled:
                    raise
                failure = error  # raised below on every rank, so no rank waits in a collective
            if dist.enabled:
                if dist.all_reduce_sum([failure is not None])[0] > 0:
                    raise failure or NonFiniteLossError(
                        f"Bradley-Terry loss (epoch {epoch}) is not finite on another rank; the fit stopped."
                    )
                dist.sum_gradients(model.trainable_parameters())
            if max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.trainable_parameters(), max_grad_norm)
            optimizer.step()
            if on_batch is not None:
                on_batch()
        if dist.enabled:
            sums = dict(zip(sums, dist.all_reduce_sum(list(sums.values()))))
        count = max(1, len(order))
        validation = evaluate_bradley_terry(model, val_pairs, micro_batch_size=micro, token_ids=val_ids, dist=dist)
        metrics = {
            M.BT_LOSS: sums["loss"] / count if order else math.nan,
            M.BT_ACCURACY: sums["accuracy"] / count if order else math.nan,
            M.BT_MARGIN: sums["margin"] / count if order else math.nan,
            M.BT_VAL_LOSS: validation["loss"],
            M.BT_VAL_ACCURACY: validation["accuracy"],
            M.BT_VAL_MARGIN: validation["margin"],
            M.BT_EPOCH: float(epoch),
        }
        history.append(metrics)
    model.eval()
    return history
