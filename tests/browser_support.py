"""What a browser test module needs first: Debian's chromium and playwright (or the module is skipped, saying which
is missing), the app driver of ``benchmarks/app_driver.py``, the browser to drive, and the folder screenshots go to."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from repo_scripts import load_repo_script

ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
CHROMIUM = Path("/usr/bin/chromium")
#: Debian's chromium-headless-shell: the same Blink without the full browser's UI layer. It draws a Streamlit page
#: with less CPU (a reload of the Setup page: 4.7 s of CPU against 5.8 s), which counts in a suite that keeps both
#: cores busy; the benchmarks keep the browser a user has.
HEADLESS_SHELL = Path("/usr/bin/chromium-headless-shell")
#: The browser the tests drive: the headless shell where ``scripts/setup.sh`` installed it, else the full chromium.
BROWSER = HEADLESS_SHELL if HEADLESS_SHELL.exists() else CHROMIUM


def require_browser() -> ModuleType:
    """playwright's sync API; skips the calling test module where Debian's chromium (or its headless shell) or
    playwright is missing."""
    if not BROWSER.exists():
        pytest.skip(
            "Debian chromium is not installed (neither /usr/bin/chromium-headless-shell nor /usr/bin/chromium): "
            "apt-get install -y --no-install-recommends chromium chromium-driver chromium-headless-shell "
            "fonts-liberation",
            allow_module_level=True,
        )
    return pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")


def app_driver() -> ModuleType:
    """The app driver; skips the calling test module where the browser or playwright is missing."""
    require_browser()
    return load_repo_script("benchmarks/app_driver.py", "app_driver")
