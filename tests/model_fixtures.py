"""Tiny random Hugging Face models for tests: a 2-layer Llama and a word-level tokenizer, built in a folder.

The builders are plain functions so any test module can call them from its own fixtures. They never touch
the network and never move the global torch RNG (weights are drawn inside ``torch.random.fork_rng``).
"""

from __future__ import annotations

from pathlib import Path

import torch

PAD, EOS, BOS, UNK = "<pad>", "</s>", "<s>", "<unk>"
WORDS = [
    "the",
    "a",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "red",
    "blue",
    "green",
    "cat",
    "dog",
    "bird",
    "sun",
    "moon",
    "yes",
    "no",
    "up",
    "down",
    "left",
    "right",
    "big",
    "small",
    "fast",
    "slow",
]


def build_tokenizer(*, with_pad: bool = True):
    """A ``PreTrainedTokenizerFast`` over ``WORDS``: whitespace word level, BOS prepended, EOS id 1."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {PAD: 0, EOS: 1, BOS: 2, UNK: 3}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])])
    special = {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK}
    if with_pad:
        special["pad_token"] = PAD
    else:
        # The pad entry stays in the vocabulary (ids stay the same); only the tokenizer forgets it is padding.
        backend.add_special_tokens([PAD])
    return PreTrainedTokenizerFast(tokenizer_object=backend, **special)


def build_model(vocab_size: int, *, seed: int = 0, initializer_range: float = 0.3, dropout: float = 0.0):
    """A random ``LlamaForCausalLM`` (hidden 32, 2 layers). A large init range makes log-probs distinct."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=initializer_range,
        attention_dropout=dropout,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval()


def build_tiny_model_dir(path: str | Path, *, with_pad: bool = True, seed: int = 0) -> Path:
    """Save a random tiny model and its tokenizer under ``path`` (``save_pretrained`` layout)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(with_pad=with_pad)
    model = build_model(len(tokenizer), seed=seed)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def embedded_tiny_model_dir() -> Path | None:
    """The embedded model's directory when it has been built, else None."""
    try:
        from comlrl_lab.models.tiny_model import tiny_model_path
    except ImportError:
        return None
    path = Path(tiny_model_path())
    return path if (path / "config.json").is_file() else None
