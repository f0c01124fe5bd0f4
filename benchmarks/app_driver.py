"""The workbench in a real browser for the benchmarks: a Streamlit server on a free local port, and Chromium.

``AppServer`` starts ``streamlit run app.py`` on 127.0.0.1 with a runs folder of its own and stops it by its PID;
``chromium_page`` opens Debian's Chromium through Playwright (never ``playwright install``): the full browser, which
users run, by default; the tests pass Debian's headless shell where it is installed. ``key`` and
``wait_idle`` find widgets and wait for a script run to end. This module measures nothing itself.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'
RUNNING = '[data-testid="stApp"][data-test-script-state="running"]'


def key(name: str) -> str:
    """CSS selector of the container of the element keyed ``name`` (Streamlit writes dots as hyphens)."""
    return ".st-key-" + name.replace(".", "-")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppServer:
    """``streamlit run app.py`` serving ``runs_root`` on 127.0.0.1; a context manager, stopped by its PID."""

    def __init__(
        self, runs_root: Path, log_path: Path, *, env: dict[str, str] | None = None, options: tuple[str, ...] = ()
    ):
        self.options = tuple(options)  # more ``streamlit run`` options, such as "--runner.postScriptGC=true"
        self.runs_root = Path(runs_root)
        self.log_path = Path(log_path)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = dict(os.environ, COMLRL_LAB_RUNS_DIR=str(self.runs_root), PYTHONPATH=str(REPO), **(env or {}))
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> AppServer:
        args = ["--server.headless", "true", "--server.address", "127.0.0.1", "--server.port", str(self.port)]
        args += ["--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none", *self.options]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "streamlit", "run", "app.py", *args],
                cwd=REPO,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{self.url}/_stcore/health", timeout=2).read() == b"ok":
                    return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"streamlit did not start; see {self.log_path}")
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@contextlib.contextmanager
def chromium_page(
    scratch: Path,
    *,
    width: int = 1400,
    height: int = 1000,
    executable: str | os.PathLike = CHROMIUM,
    accept_downloads: bool = False,
    timeout_ms: int = 120_000,
) -> Iterator:
    """A Playwright page in Debian's Chromium (or the browser at ``executable``); its config and cache go under
    ``scratch``; ``timeout_ms`` is the page's default wait."""
    from playwright.sync_api import sync_playwright

    env = {**os.environ, "XDG_CONFIG_HOME": str(scratch / "xdg-config"), "XDG_CACHE_HOME": str(scratch / "xdg-cache")}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(executable), args=LAUNCH_ARGS, env=env)
        try:
            context = browser.new_context(
                viewport={"width": width, "height": height}, accept_downloads=accept_downloads
            )
            page = context.new_page()
            page.set_default_timeout(timeout_ms)
            yield page
        finally:
            browser.close()


def screenshot(page, path: Path) -> Path:
    """A screenshot of the whole main area at ``path``: the viewport is stretched to its height, then put back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    width = page.viewport_size["width"]
    height = page.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
    page.set_viewport_size({"width": width, "height": max(1000, min(int(height) + 40, 7000))})
    page.wait_for_timeout(500)
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": width, "height": 1000})
    return path


def wait_idle(page, *, started_within_ms: int = 1000) -> None:
    """Wait for the script run an action caused to start (if it has not already ended), then for it to end.

    ``started_within_ms=0`` when the run is known to have started (something it draws is on the page): only its
    end is waited for, not a start that may have come and gone already."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    if started_within_ms > 0:
        with contextlib.suppress(PlaywrightTimeout):
            page.wait_for_selector(RUNNING, timeout=started_within_ms)
    page.wait_for_selector(IDLE, timeout=120_000)


def page_drawn(page, title: str) -> None:
    """Wait until the page titled ``title`` has drawn and its script run has ended (after a click that opens it)."""
    page.locator("h1").filter(has_text=title).wait_for()
    wait_idle(page, started_within_ms=0)


def open_page(page, address: str | None, title: str) -> None:
    """Go to ``address`` (a full URL, or None to reload) and wait until the page titled ``title`` has drawn and its
    script run has ended."""
    page.goto(address) if address else page.reload()
    page_drawn(page, title)


def choose(page, widget_key: str, option: str) -> None:
    """Pick the option whose text contains ``option`` in the selectbox keyed ``widget_key``. A rerun that lands
    while the list is open closes it, so the list is opened again (three tries) rather than waited on."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(3):
        page.wait_for_selector(IDLE, timeout=120_000)
        page.locator(f"{key(widget_key)} input[role='combobox']").click()
        try:
            page.locator("[role='option']").filter(has_text=option).first.click(timeout=5_000)
            break
        except PlaywrightTimeout:
            if attempt == 2:
                raise
            page.keyboard.press("Escape")
    wait_idle(page)
