"""What a browser test module needs first: Debian's chromium and playwright (or the module is skipped, saying which
is missing), the app driver of ``benchmarks/app_driver.py``, and the folder screenshots go to."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from repo_scripts import load_repo_script

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")


def require_browser() -> ModuleType:
    """playwright's sync API; skips the calling test module where /usr/bin/chromium or playwright is missing."""
    if not CHROMIUM.exists():
        pytest.skip(
            "Debian chromium is not installed (/usr/bin/chromium missing): "
            "apt-get install -y --no-install-recommends chromium chromium-driver fonts-liberation",
            allow_module_level=True,
        )
    return pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")


def app_driver() -> ModuleType:
    """The app driver; skips the calling test module where /usr/bin/chromium or playwright is missing."""
    require_browser()
    return load_repo_script("benchmarks/app_driver.py", "app_driver")
