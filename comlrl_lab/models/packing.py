"""Sequences that share a prefix, packed into one row each: the prefix runs once, every continuation after it.

A packed row is ``[prefix | branch 1 | branch 2 | ...]``. A block-causal mask lets each branch's tokens see the
prefix and the earlier tokens of their own branch, never another branch, and each branch's positions restart where
the prefix ends, so every token's hidden state is the one it has in its own unpacked sequence, up to float rounding.
Rows are right-padded into a micro-batch; a padding query attends to itself only, so no softmax row is empty.

Used where the model takes a custom 4D additive mask and explicit position ids (sdpa or eager attention):
MADPO's pairs after one prompt, MARLHF's candidates after one prompt and its reward model's pairs after one joint
prompt. This module builds the rows and says where each branch sits; it runs no model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: The longest packed row: attention over a row grows with the square of its length, so a prompt followed by many
#: long continuations is split into several rows rather than one that costs more than it saves.
MAX_PACKED_ROW_TOKENS = 2048


@dataclass(frozen=True)
class PackedRows:
    """A micro-batch of packed rows and where each branch's tokens sit in it.

    ``input_ids`` and ``position_ids`` are (b, T) long; ``attention_mask`` is (b, 1, T, T) additive, in the
    dtype asked for (0 where a query may attend, the dtype's minimum elsewhere). ``branch_starts[r][j]`` is the
    column of branch j's first token in row r.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    branch_starts: list[list[int]]


def pack_rows(
    prefixes: Sequence[Sequence[int]],
    branches: Sequence[Sequence[Sequence[int]]],
    *,
    pad_token_id: int,
    dtype: torch.dtype,
) -> PackedRows:
    """Row r is ``prefixes[r]`` followed by each of ``branches[r]``; right-padded to the longest row."""
    if len(prefixes) != len(branches) or not prefixes:
        raise ValueError(f"{len(prefixes)} prefixes and {len(branches)} branch lists; need as many, at least one.")
    rows, positions, segments, starts = [], [], [], []
    for prefix, row_branches in zip(prefixes, branches):
        row, position, segment, row_starts = list(prefix), list(range(len(prefix))), [0] * len(prefix), []
        for j, branch in enumerate(row_branches, start=1):
            row_starts.append(len(row))
            row += branch
            position += range(len(prefix), len(prefix) + len(branch))
            segment += [j] * len(branch)
        rows.append(row)
        positions.append(position)
        segments.append(segment)
        starts.append(row_starts)
    b, seq_len = len(rows), max(len(r) for r in rows)
    input_ids = torch.full((b, seq_len), int(pad_token_id), dtype=torch.long)  # (b, T)
    position_ids = torch.zeros((b, seq_len), dtype=torch.long)
    segment = torch.full((b, seq_len), -1, dtype=torch.long)  # -1: padding
    for r, (row, position, seg) in enumerate(zip(rows, positions, segments)):
        input_ids[r, : len(row)] = torch.tensor(row, dtype=torch.long)
        position_ids[r, : len(row)] = torch.tensor(position, dtype=torch.long)
        segment[r, : len(row)] = torch.tensor(seg, dtype=torch.long)
    query, key = segment.unsqueeze(2), segment.unsqueeze(1)  # (b, T, 1), (b, 1, T)
    causal = torch.ones((seq_len, seq_len), dtype=torch.bool).tril()
    allowed = causal & (key != -1) & ((key == 0) | (key == query))  # (b, T, T)
    allowed |= torch.eye(seq_len, dtype=torch.bool)  # a padding query attends to itself, so no row is empty
    mask = torch.zeros((b, 1, seq_len, seq_len), dtype=dtype).masked_fill_(
        ~allowed.unsqueeze(1), torch.finfo(dtype).min
    )
    return PackedRows(input_ids, position_ids, mask, starts)


def shared_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """The length of the longest common prefix of ``sequences``, short enough to leave every one a token of its own.

    A branch needs at least one token: its last one is where a pooled score is read. 0 for a single sequence.
    """
    if len(sequences) < 2:
        return 0
    limit = min(len(s) for s in sequences) - 1
    length = 0
    first = sequences[0]
    while length < limit and all(s[length] == first[length] for s in sequences[1:]):
        length += 1
    return length


def within_row_budget(
    prefix_length: int, branch_lengths: Sequence[int], max_tokens: int | None = None
) -> list[list[int]]:
    """Branch indices in consecutive runs whose row ``[prefix | branches]`` keeps within ``max_tokens`` (None:
    ``MAX_PACKED_ROW_TOKENS``); a branch that alone goes past it gets a row of its own."""
    max_tokens = MAX_PACKED_ROW_TOKENS if max_tokens is None else max_tokens
    runs: list[list[int]] = []
    length = prefix_length
    for index, branch_length in enumerate(branch_lengths):
        if not runs or length + branch_length > max_tokens:
            runs.append([])
            length = prefix_length
        runs[-1].append(index)
        length += branch_length
    return runs


def group_by_key(keys: Sequence[object], max_group: int) -> list[list[int]]:
    """Indices grouped by equal key, in order of first appearance, each group split into runs of ``max_group``."""
    groups: dict[object, list[int]] = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    size = max(1, int(max_group))
    return [members[i : i + size] for members in groups.values() for i in range(0, len(members), size)]


def micro_batches(groups: Sequence[Sequence[int]], max_sequences: int) -> list[list[list[int]]]:
    """Consecutive groups gathered into micro-batches of at most ``max_sequences`` sequences (one group at least)."""
    batches: list[list[list[int]]] = []
    current: list[list[int]] = []
    count = 0
    for group in groups:
        if current and count + len(group) > max_sequences:
            batches.append(current)
            current, count = [], 0
        current.append(list(group))
        count += len(group)
    if current:
        batches.append(current)
    return batches
