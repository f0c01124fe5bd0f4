"""``FIELD=VALUE`` config overrides on a benchmark's command line, shared by ``learning.py`` and ``vs_comlrl.py``."""

from __future__ import annotations

import argparse
import json


def parse_field(text: str) -> tuple[str, object]:
    """``FIELD=VALUE`` with a JSON value (``true``, ``2``, ``"x"``); a bare word is a string."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE, got {text!r}")
    try:
        return name.strip(), json.loads(value)
    except json.JSONDecodeError:
        return name.strip(), value
