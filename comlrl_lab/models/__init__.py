"""Hugging Face models for the agents: devices and dtypes, loading, batched sampling and batched scoring.

Submodules import torch and transformers; importing this package itself is cheap, names resolve on first use.
The embedded tiny model (``TINY_MODEL_NAME``, ``tiny_model_path``) lives in ``comlrl_lab.models.tiny_model``.
"""

from __future__ import annotations

from comlrl_lab.lazy_imports import lazy_names

_EXPORTS = {
    "resolve_devices": "devices",
    "resolve_dtype": "devices",
    "model_device": "devices",
    "AgentBundle": "loading",
    "ModelLoadError": "loading",
    "ensure_pad_token": "loading",
    "load_agents": "loading",
    "load_pretrained": "loading",
    "load_model": "loading",
    "load_tokenizer": "loading",
    "SampledText": "generation",
    "SamplingSettings": "generation",
    "count_tokens": "generation",
    "sample_candidates": "generation",
    "disable_dropout": "scoring",
    "sequence_logps": "scoring",
    "token_logps_and_mask": "scoring",
    "TINY_MODEL_NAME": "tiny_model",
    "tiny_model_path": "tiny_model",
    "is_tiny_model_name": "tiny_model",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_names(__name__, _EXPORTS)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
