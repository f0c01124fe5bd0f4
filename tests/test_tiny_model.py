"""The embedded tiny model: it loads offline through the Auto classes, and it writes short English that ends."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from repo_scripts import load_repo_script
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from comlrl_lab.data.tasks import get_task, list_word_tasks
from comlrl_lab.data.tasks.lexicon import words
from comlrl_lab.models.tiny_model import TINY_MODEL_NAME, is_tiny_model_name, tiny_model_path

REPO = Path(__file__).resolve().parent.parent
MAX_NEW_TOKENS = 64


@pytest.fixture(scope="module")
def tiny():
    path = tiny_model_path()
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def corpus_words():
    """Every word the training corpus can contain, from the corpus builder itself."""
    module = load_repo_script("scripts/tiny_corpus.py", "tiny_corpus")
    return {w for prompt, answer in module.corpus_examples(3000, seed=1) for w in words(f"{prompt} {answer}")}


def test_names_and_path():
    assert TINY_MODEL_NAME == "comlrl-lab/tiny"
    assert is_tiny_model_name("comlrl-lab/tiny") and is_tiny_model_name("tiny")
    assert not is_tiny_model_name("gpt2") and not is_tiny_model_name(None) and not is_tiny_model_name("tinyllama")
    path = Path(tiny_model_path())
    assert path.is_absolute() and path == REPO / "comlrl_lab" / "models" / "tiny"
    for name in (
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ):
        assert (path / name).is_file(), name
    assert sum(f.stat().st_size for f in path.iterdir()) < 8 * 2**20


def test_loads_offline_as_a_small_llama_with_its_own_pad_token(tiny):
    model, tokenizer = tiny
    assert isinstance(model, LlamaForCausalLM)
    assert model.config.tie_word_embeddings
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    assert 0.5e6 < sum(p.numel() for p in model.parameters()) < 2e6
    assert (tokenizer.pad_token, tokenizer.eos_token, tokenizer.bos_token) == ("<pad>", "</s>", "<s>")
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert tokenizer.padding_side == "left"
    gen = model.generation_config
    assert (gen.eos_token_id, gen.pad_token_id, gen.bos_token_id) == (
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        tokenizer.bos_token_id,
    )
    assert model.config.vocab_size == len(tokenizer)


def test_tokenizer_prepends_bos_and_round_trips_any_text(tiny):
    _, tokenizer = tiny
    text = "Agent 1 of 2. Topic: rain in winter.\nAnswer: Café ✓ 42, the river!"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


@pytest.mark.parametrize("name", list_word_tasks())
def test_seeded_samples_are_known_words_that_end_with_eos(tiny, corpus_words, name):
    model, tokenizer = tiny
    task = get_task(name)
    items = task.eval_items()[:8]
    prompts = [fmt(item) for item in items for fmt in task.formatters]  # 16 prompts, both agents
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        with torch.inference_mode():
            out = model.generate(**batch, do_sample=True, temperature=1.0, max_new_tokens=MAX_NEW_TOKENS)
    completions = out[:, batch["input_ids"].shape[1] :]  # (16, <= MAX_NEW_TOKENS)
    ended = (completions == tokenizer.eos_token_id).any(dim=1).float().mean().item()
    assert ended >= 0.9
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    sampled = [w for text in texts for w in words(text)]
    assert len(sampled) >= 16 * 3
    assert sum(w in corpus_words for w in sampled) / len(sampled) >= 0.95
    rewards = task.reward_func(texts[0::2], texts[1::2], batch_items=items)
    assert all(0.0 <= r <= 1.0 for r in rewards)
