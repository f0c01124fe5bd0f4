"""Benchmark: how fast things start: the CLI's --help and a spec error, a page's first load, a page switch, SQL.

- **CLI**: ``comlrl-lab --help`` and ``comlrl-lab run`` of a spec with a misspelt field, each a fresh process
  (median of ``--repeats``). Target: under 1 s each.
- **First load**: a fresh server's first visitor opening ``/rounds`` of a finished run (imports included); then,
  on the warm server, the same address in a new browser (nothing cached: Streamlit's 5 MB of JavaScript is fetched
  and compiled first) and a reload in the same browser (a new session with the browser's cache warm, what a user
  who presses F5 or opens a second tab gets), each until the page's title is drawn and its script is idle
  (median). Target: 2 s for a reload.
- **Page switch**: a click on another page in the sidebar until its title is drawn and its script is idle, over
  every page (median and slowest, and the median per page), after each page's first visit in the server
  process (its imports, reported on their own). Target: 0.5 s. Each switch is split in two: the
  *server* part, from the click to the last message of the script run (the last websocket frame the browser
  receives), and the *browser* part, from there to the moment the page marks its script idle (read in the page by
  a ``MutationObserver``), with the browser's long tasks (main-thread work over 50 ms) added up.
- **SQL**: ``RunStore.readonly_sql("SELECT 1")`` against the same query on the DuckDB connection itself; the
  difference is the SQL box's overhead (the first query starts the box process). Target: 0.3 s.

The run shown is a one-round quickstart run made here first. Timings depend on the machine's load, which is
printed; on a shared machine compare them with the load, and with each other. Usage::

    python benchmarks/startup.py [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from app_driver import IDLE, REPO, AppServer, chromium_page, wait_idle  # noqa: E402

PAGES = ("Setup", "Rounds", "Pairs", "Replay", "Learning", "Compare", "Data")
TITLES = {"Setup": "Set up an experiment", "Replay": "Replay buffer", "Compare": "Compare runs"}
TARGETS = {"cli --help": 1.0, "cli spec error": 1.0, "reload": 2.0, "page switch": 0.5, "sql overhead": 0.3}


def cli_seconds(args: list[str], repeats: int, cwd: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "comlrl_lab.cli", *args], cwd=cwd, env=env, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def finished_run(runs_root: Path) -> str:
    """A one-round quickstart run, made by the CLI in its own process; its id."""
    from comlrl_lab.engine.presets import quickstart_spec

    spec = quickstart_spec()
    spec.config["num_iterations"] = 1
    spec_path = runs_root.parent / "spec.json"
    spec.save(spec_path)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "comlrl_lab.cli", "run", str(spec_path), "--runs-root", str(runs_root), "--quiet"]
    subprocess.run(command, check=True, env=env, cwd=runs_root.parent, stdout=subprocess.DEVNULL)
    (run_dir,) = runs_root.iterdir()
    return run_dir.name


def page_ready(page, title: str, started: float) -> float:
    page.locator("h1").filter(has_text=TITLES.get(title, title)).first.wait_for(state="visible", timeout=120_000)
    page.wait_for_selector(IDLE, timeout=120_000)
    return time.perf_counter() - started


# Recorded in the page, so that the browser's own moment counts, not the moment Playwright's polling notices it.
WATCH_SCRIPT_STATE = """() => {
  window.__idleAt = [];
  window.__longTasks = [];
  const app = document.querySelector('[data-testid="stApp"]');
  new MutationObserver(() => {
    if (app.getAttribute('data-test-script-state') === 'notRunning') window.__idleAt.push(Date.now());
  }).observe(app, {attributes: true, attributeFilter: ['data-test-script-state']});
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) window.__longTasks.push(entry.duration);
  }).observe({type: 'longtask'});
}"""


class FrameClock:
    """Epoch milliseconds of the websocket frames the page receives from the server."""

    def __init__(self, page):
        self.times: list[float] = []
        page.on("websocket", lambda socket: socket.on("framereceived", lambda _: self.times.append(time.time() * 1000)))


def page_switch(page, frames: FrameClock, title: str) -> dict[str, float]:
    """Seconds of one sidebar click to ``title``: in all, the server's part and the browser's (see the docstring)."""
    wait_idle(page)
    page.evaluate("() => { window.__idleAt = []; window.__longTasks = []; }")
    frames.times.clear()
    clicked_ms = time.time() * 1000
    started = time.perf_counter()
    page.locator(f"[data-testid='stSidebarNav'] a[href$='/{title.lower()}']").first.click()
    total = page_ready(page, title, started)
    idle_at = page.evaluate("() => window.__idleAt")
    server_done = max(frames.times, default=clicked_ms)
    drawn = max(idle_at) if idle_at else server_done  # the run ended before the observer saw it start
    return {
        "total": total,
        "server": (server_done - clicked_ms) / 1000,
        "browser": max(0.0, drawn - server_done) / 1000,
        "long tasks": sum(page.evaluate("() => window.__longTasks")) / 1000,
    }


def sql_overhead(store_path: Path, repeats: int) -> tuple[float, float]:
    """(first query, median of the next) seconds of the SQL box's SELECT 1, minus DuckDB's own SELECT 1."""
    from comlrl_lab.store import RunStore

    with RunStore(store_path, read_only=True) as store:
        started = time.perf_counter()
        store.readonly_sql("SELECT 1 AS x")
        first = time.perf_counter() - started
        boxed, direct = [], []
        for _ in range(repeats):
            started = time.perf_counter()
            store.readonly_sql("SELECT 1 AS x")
            boxed.append(time.perf_counter() - started)
            started = time.perf_counter()
            store.cursor().execute("SELECT 1 AS x").fetchall()
            direct.append(time.perf_counter() - started)
    return first, statistics.median(boxed) - statistics.median(direct)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    result: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="startup-") as tmp:
        scratch = Path(tmp)
        bad = scratch / "bad.yaml"
        bad.write_text("algorithm: MADPOIter\nconfig:\n  num_iteratons: 2\n", encoding="utf-8")
        result["cli --help"] = cli_seconds(["--help"], args.repeats, scratch)
        result["cli spec error"] = cli_seconds(["run", str(bad)], args.repeats, scratch)
        runs_root = scratch / "runs"
        runs_root.mkdir()
        run_id = finished_run(runs_root)
        address = f"/rounds?run.open={run_id}"
        with AppServer(runs_root, scratch / "server.log") as server:
            with chromium_page(scratch) as page:
                started = time.perf_counter()
                page.goto(server.url + address)
                result["cold first load"] = page_ready(page, "Rounds", started)
            new_browser = []
            for _ in range(args.repeats):
                with chromium_page(scratch) as page:
                    started = time.perf_counter()
                    page.goto(server.url + address)
                    new_browser.append(page_ready(page, "Rounds", started))
            result["new browser load"] = statistics.median(new_browser)
            with chromium_page(scratch) as page:
                frames = FrameClock(page)
                page.goto(server.url + address)
                page_ready(page, "Rounds", time.perf_counter())
                reloads = []
                for _ in range(args.repeats):
                    started = time.perf_counter()
                    page.reload()
                    reloads.append(page_ready(page, "Rounds", started))
                result["reload"] = statistics.median(reloads)
                page.evaluate(WATCH_SCRIPT_STATE)
                # Each page's first visit in the server process pays its imports once: reported on its own.
                first_visits = [page_switch(page, frames, title)["total"] for title in PAGES]
                result["first visit of a page"] = statistics.median(first_visits)
                result["first visit, slowest"] = max(first_visits)
                switches: dict[str, list[dict[str, float]]] = {title: [] for title in PAGES}
                for _ in range(max(1, args.repeats // 2)):
                    for title in PAGES:
                        switches[title].append(page_switch(page, frames, title))
            every = [switch for per_page in switches.values() for switch in per_page]
            for part in ("total", "server", "browser", "long tasks"):
                name = "page switch" if part == "total" else f"page switch, {part}"
                result[name] = statistics.median(switch[part] for switch in every)
            result["page switch, slowest"] = max(switch["total"] for switch in every)
            for title, per_page in switches.items():
                result[f"switch to {title}"] = statistics.median(switch["total"] for switch in per_page)
        first, overhead = sql_overhead(runs_root / run_id / "run.duckdb", args.repeats * 4)
        result["sql first query"] = first
        result["sql overhead"] = overhead
    load_after = os.getloadavg()
    for name, seconds in result.items():
        target = TARGETS.get(name)
        verdict = "" if target is None else f"  (target {target} s: {'meets' if seconds <= target else 'misses'})"
        print(f"{name:>22}: {seconds:6.3f} s{verdict}")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps({"seconds": result, "load": [load_before, load_after]}, indent=2))
    return result


if __name__ == "__main__":
    main()
