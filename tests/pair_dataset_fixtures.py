"""Helpers for the pair-dataset tests: SmolLM2's chat template and what it renders, the embedded model with a
template set, and loading an export through its card."""

from __future__ import annotations

import shutil
from pathlib import Path

from comlrl_lab.models.tiny_model import tiny_model_path

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
PREFIX = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
#: SmolLM2-135M-Instruct's chat template: ChatML with a default system prompt.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + SYSTEM + "<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def load(folder: Path, tmp_path: Path, config: str | None = None):
    """A file through the card beside it, cached in the test's own folder (``datasets`` caches a card's files by
    its YAML), as a ``datasets.Dataset``."""
    import datasets

    return datasets.load_dataset(str(folder), config, split="train", cache_dir=str(tmp_path / "hf-cache"))


def tokenizer_with(template: str):
    """The embedded model's tokenizer with ``template`` as its chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    tokenizer.chat_template = template
    return tokenizer


def chat_model_dir(tmp_path: Path, template: str = SMOLLM2_TEMPLATE) -> Path:
    """The embedded model's folder with a chat template set (SmolLM2's by default)."""
    folder = tmp_path / "chat-tiny"
    shutil.copytree(tiny_model_path(), folder)
    tokenizer = tokenizer_with(template)
    tokenizer.save_pretrained(folder)
    return folder
