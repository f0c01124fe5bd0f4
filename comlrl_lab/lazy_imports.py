"""A package's names resolved on first use (PEP 562): importing the package does not import its heavy modules.

``__getattr__ = lazy_names(__name__, {"Name": "module", ...})`` in a package's ``__init__`` makes
``package.Name`` import ``package.module`` the first time it is asked for, and keeps it as a plain attribute
after. Used where an import must stay cheap: torch for the configs and the Setup page, DuckDB and pandas for the
command line's ``--help`` and spec checks.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: each of ``names`` (name -> submodule) imported when first read."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
