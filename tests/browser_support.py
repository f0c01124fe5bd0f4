"""What a browser test module needs first: Debian's chromium and playwright (or the module is skipped, saying which
is missing), the app driver of ``benchmarks/app_driver.py``, and the folder screenshots go to."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from repo_scripts import load_repo_script

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"


def app_driver() -> ModuleType:
    """The app driver; skips the calling test module where /usr/bin/chromium or playwright is missing."""
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("Debian chromium is not installed (/usr/bin/chromium missing)", allow_module_level=True)
    pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")
    return load_repo_script("benchmarks/app_driver.py", "app_driver")
