"""Fingerprints of a trainer's initial models and tokenizers, so a resume can tell whether it starts from the same ones.

A checkpoint written before the first train phase holds no weights (weights version 0: what a freshly built trainer
holds), so a trainer rebuilt from other models would silently continue from them. Each checkpoint records the
fingerprints of the trainer's initial weights (per agent: the trained part and the frozen part, which differ only
under LoRA), of the learner's own initial models (critics, value heads) and of each tokenizer; ``load_checkpoint``
compares them with the rebuilt trainer's (``base.py`` decides what a difference means).

A weights fingerprint hashes each tensor's name, shape, dtype and 256 evenly spaced values, not every byte: it tells
apart models built from other files or other seeds (every value differs), in microseconds even for large models, but
not two models that differ in a handful of values. A tokenizer's hashes its vocabulary and special token ids, which
fix what the stored token ids mean. This module does not load or save checkpoints.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from comlrl_lab.models.lora import is_adapter_model

SAMPLES_PER_TENSOR = 256


class ModelMismatch(ValueError):
    """A checkpoint was written by a trainer built from other models or tokenizers than the one resuming it."""


def tensors_fingerprint(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """A hash of named tensors: names, shapes, dtypes and a sample of evenly spaced values of each."""
    digest = hashlib.sha256()
    for name, tensor in sorted(tensors, key=lambda item: item[0]):
        flat = tensor.detach().reshape(-1)
        count = flat.numel()
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
        if count:
            index = torch.linspace(0, count - 1, steps=min(count, SAMPLES_PER_TENSOR), device=flat.device).long()
            # float32 rounds count - 1 up past 2**24 (SmolLM2's 49152 x 576 embedding gave 28311552): clamp rather
            # than compute the spacing another way, so every fingerprint already written stays the same.
            index = index.clamp_(max=count - 1)
            digest.update(flat[index].to(torch.float64).cpu().numpy().tobytes())
    return digest.hexdigest()[:24]


def model_fingerprint(model: Any) -> dict[str, str]:
    """``{"trainable": ..., "frozen": ...}``: the part a checkpoint saves and restores (every tensor of a plain model,
    the adapters of a LoRA model) and the rest (a LoRA model's frozen base, reloaded from its source)."""
    tensors = list(model.state_dict().items())
    if not is_adapter_model(model):
        return {"trainable": tensors_fingerprint(tensors), "frozen": tensors_fingerprint([])}
    trained = {name for name, p in model.named_parameters() if p.requires_grad}
    return {
        "trainable": tensors_fingerprint([(n, t) for n, t in tensors if n in trained]),
        "frozen": tensors_fingerprint([(n, t) for n, t in tensors if n not in trained]),
    }


def nested_tensors(tree: Any, path: str = "", skip: str = "optimizer") -> list[tuple[str, torch.Tensor]]:
    """The tensors of a nested state (dicts and lists), named by their path; subtrees whose key holds ``skip`` are
    left out (optimiser moments start empty and say nothing about the model)."""
    if isinstance(tree, torch.Tensor):
        return [(path, tree)]
    if isinstance(tree, Mapping):
        return [
            item
            for key, value in tree.items()
            if skip not in str(key)
            for item in nested_tensors(value, f"{path}.{key}", skip)
        ]
    if isinstance(tree, (list, tuple)):
        return [item for i, value in enumerate(tree) for item in nested_tensors(value, f"{path}[{i}]", skip)]
    return []


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A hash of what token ids mean: the vocabulary (added tokens included) and the special token ids."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    special = {name: getattr(tokenizer, f"{name}_token_id", None) for name in ("pad", "eos", "bos", "unk")}
    payload = json.dumps([vocab, special], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:24]


def differences(saved: Mapping[str, Any], mine: Mapping[str, Any]) -> dict[str, list[str]]:
    """What differs between two fingerprint records, by kind: ``tokenizers``, ``frozen``, ``trainable``, ``extras``;
    each a list of which (``agent 0``, ...). Kinds a record lacks are not compared."""
    found: dict[str, list[str]] = {"tokenizers": [], "frozen": [], "trainable": [], "extras": []}
    for i, (a, b) in enumerate(zip(saved.get("tokenizers", []), mine.get("tokenizers", []))):
        if a != b:
            found["tokenizers"].append(f"agent {i}")
    for i, (a, b) in enumerate(zip(saved.get("agents", []), mine.get("agents", []))):
        for part in ("frozen", "trainable"):
            if a.get(part) != b.get(part):
                found[part].append(f"agent {i}")
    if "extras" in saved and "extras" in mine and saved["extras"] != mine["extras"]:
        found["extras"].append("the learner's critics or value heads")
    if len(saved.get("agents", [])) != len(mine.get("agents", [])):
        found["trainable"].append(f"{len(saved.get('agents', []))} agents, not {len(mine.get('agents', []))}")
    return {kind: which for kind, which in found.items() if which}
