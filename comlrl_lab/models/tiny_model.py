"""Where the embedded tiny model lives, and which model names mean it.

The model (a 1M-parameter Llama and its tokenizer, Hugging Face format) ships inside the package under
``comlrl_lab/models/tiny/``, so the workbench and the tests run with no network. This module only names and
locates it; loading goes through the ordinary ``from_pretrained`` path like any other model. Rebuild it with
``python scripts/train_tiny_lm.py`` (see docs/tiny_model.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: The identifier users pass instead of a hub id or a path.
TINY_MODEL_NAME = "comlrl-lab/tiny"
_ALIASES = frozenset({TINY_MODEL_NAME, "tiny"})


def tiny_model_path() -> str:
    """Absolute path of the embedded model directory inside the installed package."""
    return str(Path(__file__).resolve().parent / "tiny")


def is_tiny_model_name(source: Any) -> bool:
    """Whether ``source`` names the embedded model: ``"comlrl-lab/tiny"`` or ``"tiny"`` (not a path to it)."""
    return isinstance(source, str) and source.strip() in _ALIASES
