"""Packed rows: sequences after a shared prefix scored from one row, for MARLHF's policy and reward model."""

from __future__ import annotations

import random

import pytest
import torch

from comlrl_lab.models import packing
from comlrl_lab.models.packing import group_by_key, micro_batches, pack_rows, shared_prefix_length, within_row_budget

NEG = torch.finfo(torch.float32).min


def test_pack_rows_lays_out_prefix_then_branches_with_restarted_positions():
    packed = pack_rows([[11, 12], [21]], [[[13, 14], [15]], [[22]]], pad_token_id=0, dtype=torch.float32)
    assert packed.input_ids.tolist() == [[11, 12, 13, 14, 15], [21, 22, 0, 0, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2], [0, 1, 0, 0, 0]]
    assert packed.branch_starts == [[2, 4], [1]]
    allowed = (packed.attention_mask[:, 0] == 0).int().tolist()
    # Row 0: the second branch (column 4) sees the prefix and itself, never the first branch (columns 2-3).
    assert allowed[0] == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 0, 0, 1],
    ]
    # Row 1: no query attends to padding but itself, so no softmax row is empty (padding's outputs are never read).
    assert allowed[1] == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 0, 0, 1, 0],
        [1, 0, 0, 0, 1],
    ]
    assert packed.attention_mask.min() == NEG


def test_shared_prefix_leaves_every_sequence_a_token_of_its_own():
    assert shared_prefix_length([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 9]]) == 2
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2  # identical: the last token stays a branch
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3, 4]]) == 2
    assert shared_prefix_length([[7], [7, 8]]) == 0
    assert shared_prefix_length([[1, 2], [3, 2]]) == 0
    assert shared_prefix_length([[1, 2, 3]]) == 0


def test_groups_keep_first_appearance_order_and_split_at_the_cap():
    assert group_by_key(["a", "b", "a", "a", "c", "a"], 3) == [[0, 2, 3], [5], [1], [4]]
    assert micro_batches([[0, 2, 3], [5], [1], [4]], 4) == [[[0, 2, 3], [5]], [[1], [4]]]
    assert micro_batches([[0, 1, 2, 3, 4]], 2) == [[[0, 1, 2, 3, 4]]]  # a group larger than the cap goes alone


def test_a_row_keeps_within_its_token_budget():
    assert within_row_budget(4, [3, 3, 3], max_tokens=10) == [[0, 1], [2]]  # 4+3+3 = 10 fits, a third would not
    assert within_row_budget(4, [20, 1, 1], max_tokens=10) == [[0], [1, 2]]  # too long alone: a row of its own
    assert within_row_budget(0, [1] * 5) == [[0, 1, 2, 3, 4]]  # the default budget: 2,048 tokens
    assert within_row_budget(3, []) == []


def _candidates(vocab_size: int, seed: int):
    """Three prompts with four completions each (one empty), and a prompt of its own, interleaved."""
    rng = random.Random(seed)

    def ids(n):
        return [rng.randrange(5, vocab_size) for _ in range(n)]

    prompts = [ids(n) for n in (6, 11, 3)]
    prompt_ids, completion_ids = [], []
    for k, prompt in enumerate(prompts):
        for length in (5, 0, 9, 2) if k == 1 else (4, 7, 1, 6):
            prompt_ids.append(prompt)
            completion_ids.append(ids(length))
    prompt_ids.insert(3, ids(4))
    completion_ids.insert(3, ids(3))
    return prompt_ids, completion_ids


@pytest.mark.parametrize("micro_batch_size,row_budget,packed_rows", [(3, 2048, 6), (16, 2048, 4), (16, 20, 5)])
def test_packed_candidates_score_as_one_row_per_sequence_does(
    model_dir, monkeypatch, micro_batch_size, row_budget, packed_rows
):
    from comlrl_lab.models.loading import load_model
    from comlrl_lab.models.scoring import supports_packed_pairs, token_logps_and_mask

    model = load_model(model_dir, device="cpu", dtype="float32").eval()
    assert supports_packed_pairs(model)
    rows = []
    model.model.register_forward_pre_hook(  # the decoder: it runs in every scoring forward
        lambda module, args, kwargs: rows.append(len(kwargs["input_ids"])), with_kwargs=True
    )
    # 20 tokens: the second prompt (11 tokens) takes two rows for its three candidates.
    monkeypatch.setattr(packing, "MAX_PACKED_ROW_TOKENS", row_budget)
    prompt_ids, completion_ids = _candidates(model.config.vocab_size, 0)
    weights = torch.linspace(-1.0, 2.0, len(prompt_ids)).unsqueeze(-1)  # a different weight per sequence
    kwargs = dict(pad_token_id=0, micro_batch_size=micro_batch_size)
    packed, packed_mask = token_logps_and_mask(model, prompt_ids, completion_ids, packed=True, **kwargs)
    # Four prompts (three with four candidates, one empty), split by the micro-batch's 3 and by the row budget.
    assert sum(rows) == packed_rows
    rows.clear()
    (packed * weights).sum().backward()
    packed_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    unpacked, mask = token_logps_and_mask(model, prompt_ids, completion_ids, **kwargs)
    assert sum(rows) == len(completion_ids) - 1  # one row per completion with something to score
    (unpacked * weights).sum().backward()
    assert torch.equal(packed_mask, mask)
    assert mask.sum(dim=-1).tolist() == [len(c) for c in completion_ids]
    torch.testing.assert_close(packed, unpacked, rtol=1e-5, atol=1e-4)
    empty = completion_ids.index([])
    assert float(packed[empty].detach().abs().sum()) == 0.0  # the empty completion scores nothing
    for got, expected in zip(packed_grads, (p.grad for p in model.parameters())):
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-4)


def test_a_packed_candidate_never_sees_its_neighbours(model_dir):
    from comlrl_lab.models.loading import load_model
    from comlrl_lab.models.scoring import token_logps_and_mask

    model = load_model(model_dir, device="cpu", dtype="float32").eval()
    prompt_ids, completion_ids = _candidates(model.config.vocab_size, 1)
    vocab = model.config.vocab_size
    changed = [list(c) for c in completion_ids]
    changed[0] = [(t * 7 + 3) % (vocab - 5) + 5 for t in changed[0]]  # the first candidate of the first prompt
    with torch.no_grad():
        before, _ = token_logps_and_mask(model, prompt_ids, completion_ids, pad_token_id=0, packed=True)
        after, _ = token_logps_and_mask(model, prompt_ids, changed, pad_token_id=0, packed=True)
    torch.testing.assert_close(after[1:], before[1:], rtol=0, atol=1e-5)
    assert not torch.allclose(after[0], before[0])


def _reward_model(model_dir: str, packed: bool):
    from comlrl_lab.models.loading import load_model, load_tokenizer
    from comlrl_lab.trainers.preference.learning.reward_model import JointRewardModel

    backbone = load_model(model_dir, device="cpu", dtype="float32")
    generator = torch.Generator().manual_seed(0)
    return JointRewardModel.from_backbone(backbone, load_tokenizer(model_dir), generator=generator, packed=packed)


@pytest.mark.parametrize("row_budget", [2048, 40])
def test_reward_model_scores_an_items_candidates_from_one_packed_row(model_dir, monkeypatch, row_budget):
    monkeypatch.setattr(packing, "MAX_PACKED_ROW_TOKENS", row_budget)  # 40: an item's candidates take several rows
    rows, packed = _reward_model(model_dir, False), _reward_model(model_dir, True)
    assert packed.packed and not rows.packed
    prompts = [("Agent 1: a cat", "Agent 2: a cat, twice")] * 5 + [("Agent 1: a dog", "Agent 2: a dog, twice")] * 3
    prompts.insert(2, ("Agent 1: alone", "Agent 2: alone"))
    words = ["cat", "dog", "sun", "moon", "tree", "book", "friend", "house", "river"]
    completions = [(f"The {word} is here.", "It is nice. " * (i % 3)) for i, word in enumerate(words)]
    for micro_batch_size in (2, 32):
        expected = rows.score_joint(prompts, completions, micro_batch_size=micro_batch_size)
        got = packed.score_joint(prompts, completions, micro_batch_size=micro_batch_size)
        assert got == pytest.approx(expected, abs=1e-5)
    assert len(set(expected)) == len(expected)  # every text scored as itself, none swapped


def test_bradley_terry_fit_on_packed_pairs_follows_the_unpacked_fit(model_dir):
    from comlrl_lab.trainers.preference.learning.reward_model import fit_bradley_terry

    prompt = "Joint multi-agent response\n\nAgent 1 prompt:\nWrite about a cat.\n\nAgent 1 response:\n"
    pairs = [(prompt + "A cat sat." * (i + 1), prompt + "No." * (i % 3 + 1)) for i in range(6)]
    pairs.append(("short", "other text entirely"))  # nothing shared: the pair packs with an empty prefix
    histories = []
    for packed in (False, True):
        model = _reward_model(model_dir, packed)
        histories.append(
            fit_bradley_terry(model, pairs, pairs[:2], epochs=2, batch_size=2, learning_rate=1e-3, rng=random.Random(0))
        )
    for unpacked_epoch, packed_epoch in zip(*histories):
        assert packed_epoch == pytest.approx(unpacked_epoch, rel=1e-4, abs=1e-5)
    assert histories[1][1]["bt/loss"] < histories[1][0]["bt/loss"]  # it learned: the same steps, packed


def test_models_with_a_sliding_window_score_unpacked(model_dir, monkeypatch):
    from comlrl_lab.models.loading import load_model
    from comlrl_lab.models.scoring import supports_packed_pairs

    model = load_model(model_dir, device="cpu", dtype="float32")
    assert supports_packed_pairs(model)
    # A custom 4D mask replaces a model's own, so a sliding window would be lost; such models never pack.
    monkeypatch.setattr(model.config, "sliding_window", 16, raising=False)
    assert not supports_packed_pairs(model)
    monkeypatch.setattr(model.config, "use_sliding_window", False, raising=False)  # Qwen2's switch: off
    assert supports_packed_pairs(model)
    monkeypatch.setattr(model.config, "layer_types", ["full_attention", "sliding_attention"], raising=False)
    assert not supports_packed_pairs(model)


def test_reward_model_of_a_model_without_custom_masks_does_not_pack(model_dir, monkeypatch):
    monkeypatch.setattr(
        "comlrl_lab.trainers.preference.learning.reward_model.supports_packed_pairs", lambda backbone: False
    )
    assert not _reward_model(model_dir, True).packed
