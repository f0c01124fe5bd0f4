"""The Hugging Face reward-model oracle on a tiny random LlamaForSequenceClassification (CPU, no network)."""

from __future__ import annotations

import math

import pytest
import torch

from comlrl_lab.data.rewards import call_reward_function
from comlrl_lab.models import loading
from comlrl_lab.models.reward_oracle import hf_reward_model_oracle, joint_reward_text

WORDS = [
    "joint",
    "multi",
    "agent",
    "response",
    "prompt",
    "write",
    "a",
    "sentence",
    "about",
    "the",
    "rain",
    "garden",
    "good",
    "bad",
    "lovely",
    "day",
    "sun",
    "moon",
]

COMPLETIONS = [
    ["the rain", "a lovely day about the garden good", "bad", "write", "good good good good good", "sun", "moon day"],
    ["good", "bad bad", "lovely day", "the garden", "moon", "a sentence about the sun and the moon", "rain"],
]
PROMPTS = [["write about the rain"] * 4 + ["write a sentence"] * 3, ["write something good"] * 7]


def _tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"[PAD]": 0, "[UNK]": 1}
    for word in WORDS + ["Joint", "Agent", "1", "2", ":"]:
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]")


def _model(vocab_size: int, num_labels: int = 1):
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.3,
        num_labels=num_labels,
        pad_token_id=0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return LlamaForSequenceClassification(config)


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("reward_model")
    tokenizer = _tokenizer()
    tokenizer.save_pretrained(path)
    _model(len(tokenizer)).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def oracle(reward_model_dir):
    return hf_reward_model_oracle(reward_model_dir, device="cpu", batch_size=3)


def test_loads_offline_on_its_device_in_eval_mode(oracle):
    assert oracle.supports_batch is True
    assert oracle.device == torch.device("cpu")
    assert not oracle.model.training
    assert not any(p.requires_grad for p in oracle.model.parameters())
    assert next(oracle.model.parameters()).dtype == torch.float32


def test_joint_text_matches_comlrl():
    text = joint_reward_text(["P1", "P2"], ["C1", "C2"])
    assert (
        text
        == "Joint multi-agent response\n\nAgent 1 prompt:\nP1\n\nAgent 1 response:\nC1\n\nAgent 2 prompt:\nP2\n\nAgent 2 response:\nC2"
    )


def test_score_matches_a_plain_forward(oracle):
    text = joint_reward_text([PROMPTS[0][1], PROMPTS[1][1]], [COMPLETIONS[0][1], COMPLETIONS[1][1]])
    encoded = oracle.tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        expected = oracle.model(**encoded).logits[0, 0].item()
    assert oracle.score_texts([text]) == pytest.approx([expected], abs=1e-6)


def test_batched_scores_equal_one_by_one(oracle):
    batched = call_reward_function(oracle, COMPLETIONS, prompts=PROMPTS)
    single = [
        call_reward_function(oracle, [[c1], [c2]], prompts=[[p1], [p2]])[0]
        for c1, c2, p1, p2 in zip(*COMPLETIONS, *PROMPTS)
    ]
    assert len(batched) == 7
    assert batched == pytest.approx(single, abs=1e-5)
    assert len(set(round(s, 4) for s in batched)) == 7  # a random model still tells the texts apart


def test_left_and_right_padding_give_the_same_scores(reward_model_dir, oracle):
    left = hf_reward_model_oracle(reward_model_dir, device="cpu", batch_size=7, padding_side="left")
    right_scores = oracle(*COMPLETIONS, agent_prompts=PROMPTS)
    assert left(*COMPLETIONS, agent_prompts=PROMPTS) == pytest.approx(right_scores, abs=1e-5)


def test_squash_maps_into_unit_interval(reward_model_dir, oracle):
    squashed = hf_reward_model_oracle(reward_model_dir, device="cpu", squash=True)
    raw = oracle(*COMPLETIONS, agent_prompts=PROMPTS)
    out = squashed(*COMPLETIONS, agent_prompts=PROMPTS)
    assert out == pytest.approx([1 / (1 + math.exp(-r)) for r in raw], abs=1e-6)
    assert squashed.reward_range == (0.0, 1.0)
    assert not hasattr(oracle, "reward_range")


def test_model_object_custom_text_and_score_index():
    tokenizer = _tokenizer()
    model = _model(len(tokenizer), num_labels=2)
    oracle = hf_reward_model_oracle(
        model, tokenizer=tokenizer, device="cpu", score_index=1, joint_text_fn=lambda p, c: " ".join(c)
    )
    encoded = tokenizer("good moon", return_tensors="pt")
    with torch.no_grad():
        expected = model(**encoded).logits[0, 1].item()
    assert oracle(["good"], ["moon"], agent_prompts=[["x"], ["y"]]) == pytest.approx([expected], abs=1e-6)
    with pytest.raises(ValueError, match=r"score_index must be in \[0, 2\)"):
        hf_reward_model_oracle(model, tokenizer=tokenizer, device="cpu", score_index=2)
    with pytest.raises(ValueError, match="A tokenizer must be provided"):
        hf_reward_model_oracle(model, device="cpu")


def test_prompts_are_required(oracle):
    with pytest.raises(ValueError, match="reads every agent's prompt"):
        oracle(*COMPLETIONS)
    with pytest.raises(ValueError, match="reads every agent's prompt"):
        oracle(*COMPLETIONS, prompts=PROMPTS[0])  # CoMLRL's P holds agent 0's prompt only
    with pytest.raises(ValueError, match="agent_prompts must hold 2 lists of 7 prompts"):
        oracle(*COMPLETIONS, agent_prompts=[PROMPTS[0]])


def test_not_found_errors(tmp_path, monkeypatch):
    with pytest.raises(loading.ModelLoadError, match="does not exist"):
        hf_reward_model_oracle(str(tmp_path / "missing"), device="cpu")
    monkeypatch.setattr(loading, "_hub_offline", lambda: False)
    monkeypatch.setattr(loading, "hub_reachable", lambda *a, **k: False)
    with pytest.raises(loading.ModelLoadError, match="not found locally .* no network"):
        hf_reward_model_oracle("comlrl-lab-test/no-such-reward-model", device="cpu")
