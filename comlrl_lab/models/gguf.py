"""GGUF files as Hugging Face models: load one as a plain (unquantised) model, or convert it once to a folder.

transformers reads a ``.gguf`` file with ``from_pretrained(folder, gguf_file=NAME)`` (the ``gguf`` package
parses it) and dequantises every tensor to float32. The model it returns still carries the GGUF quantizer, so
``save_pretrained`` refuses it; ``plain_model`` rebuilds the same architecture from its config without the
quantisation settings and moves the dequantised weights in, which gives an ordinary model that saves, copies
and trains like any other. ``convert_gguf`` writes that model, its tokenizer (chat template included) and its
generation config as a safetensors folder. This module does not download or register anything
(``registry.py`` does).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GGUF_SUFFIX = ".gguf"


def is_gguf_file(source: Any) -> bool:
    """Whether ``source`` is the path of an existing ``.gguf`` file."""
    return (
        isinstance(source, (str, os.PathLike)) and str(source).lower().endswith(GGUF_SUFFIX) and os.path.isfile(source)
    )


def gguf_arguments(path: str | os.PathLike) -> tuple[str, dict[str, str]]:
    """``from_pretrained``'s folder and ``gguf_file`` keyword for the file at ``path``."""
    path = Path(path).resolve()
    return str(path.parent), {"gguf_file": path.name}


def plain_model(model: Any) -> Any:
    """``model`` as an ordinary model of the same class and config, without its GGUF quantizer.

    The weights are moved, not copied: the new model is built on the meta device and takes the tensors as they
    are (``assign=True``), so the conversion needs no second copy of the weights in memory.
    """
    if getattr(model, "hf_quantizer", None) is None and getattr(model.config, "quantization_config", None) is None:
        return model
    import torch

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = type(model)(config)
    plain.load_state_dict(model.state_dict(), assign=True)
    # Buffers outside the state dict (rotary frequencies) are computed at construction: take the loaded model's.
    for name, buffer in model.named_buffers():
        owner_name, _, attribute = name.rpartition(".")
        owner = plain.get_submodule(owner_name)
        if getattr(owner, attribute).is_meta:
            setattr(owner, attribute, buffer)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    return plain.eval()


def load_gguf(loader: Callable[..., Any], path: str | os.PathLike, **kwargs: Any) -> Any:
    """``loader`` (any ``from_pretrained``) on a ``.gguf`` file; a model comes back as a ``plain_model``."""
    folder, gguf = gguf_arguments(path)
    loaded = loader(folder, **gguf, **kwargs)
    return plain_model(loaded) if hasattr(loaded, "state_dict") else loaded


@dataclass(frozen=True)
class ModelSummary:
    """What ``models list`` and the model descriptions show about a converted folder."""

    architecture: str
    parameters: int
    dtype: str


def convert_gguf(
    gguf_path: str | os.PathLike, out_dir: str | os.PathLike, *, on_step: Callable[[str], None] | None = None
) -> ModelSummary:
    """Write the model in ``gguf_path`` to ``out_dir`` as a Hugging Face folder: safetensors weights, the tokenizer
    with its chat template, the config and the generation config. ``on_step(description)`` is called before each
    of the three steps (tokenizer, weights, writing). ``out_dir`` must not exist yet or be empty."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    step = on_step or (lambda _description: None)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    step("reading the tokenizer")
    tokenizer = load_gguf(AutoTokenizer.from_pretrained, gguf_path)
    step("dequantising the weights")
    model = load_gguf(AutoModelForCausalLM.from_pretrained, gguf_path, dtype=torch.float32)
    step("writing safetensors")
    # The GGUF's general.name lands in _name_or_path; the folder is the model's name from now on.
    model.config._name_or_path = str(out_dir)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    parameters = sum(p.numel() for p in model.parameters())
    return ModelSummary(type(model).__name__, parameters, str(model.dtype).removeprefix("torch."))
