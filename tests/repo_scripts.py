"""Import one of the repository's scripts (``benchmarks/``, ``scripts/``) as a module, for tests of its functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_repo_script(relative_path: str, module_name: str) -> ModuleType:
    """``ROOT / relative_path`` imported as ``module_name``, registered in ``sys.modules`` first, since dataclasses
    look their module up there while the file runs. The script's folder goes on ``sys.path``, as when it runs, so
    it imports its sibling modules (``benchmarks/field_args.py``)."""
    folder = str((ROOT / relative_path).parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(module_name, ROOT / relative_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module
