"""Benchmark: does the app slow a run down? Preset rounds with the Rounds page open, closed, and in the CLI.

Each run is a fresh quickstart run (the preset) of ``--rounds`` rounds (4 by default); round 1 loads the models, and
rounds 2..N, the steady state, are timed each. A round's time is read from the run's own phase commits
(``snapshots/rounds.parquet``: its evaluate commit minus the previous round's), so the three ways are timed alike:

- **watched**: the run is created here, opened at ``/rounds`` in Chromium, started with "Run to the end", and the
  page stays open while it trains (its live progress polling included);
- **unwatched**: the same, but the tab leaves for ``about:blank`` once the click's rerun has drawn: the app's own
  cost, the server process around the trainer, without a page;
- **cli**: ``comlrl-lab run SPEC`` in a process of its own, the same spec and seed.

The three alternate (watched, unwatched, cli, then rotated), ``--repeats`` times, so a change in the machine's
load hits all three alike. Then, unless ``--sweep-cells 0``, a sweep of the same spec (``dpo_beta=0.2,0.3`` x seeds)
is started from the Compare page's "Run a grid", and its cells alternate between the Compare page open (watched)
and closed, ABBA; each cell's rounds are timed the same way. It prints the machine (CPU, torch's kernels), every
time with the load average when its run ended, the medians, and the ratios of the medians, each with its 95%
bootstrap interval: watched/unwatched (target at most 1.1), and app/CLI with the page closed and open (target at most
1.05 each).
``--post-script-gc`` serves the app with Streamlit's full garbage collection after every script run turned back on
(``runner.postScriptGC``, which ``.streamlit/config.toml`` turns off): the cause of the slowdown, for a before/after
on the same machine. ``--set FIELD=VALUE`` (repeatable) changes a config field of every run, app and CLI alike, so
one setting can be compared on and off (``--set gc_freeze_during_steps=false``). Usage::

    python benchmarks/watched_round.py [--repeats 2] [--rounds 4] [--sweep-cells 4] [--task length_ratio]
        [--post-script-gc] [--set FIELD=VALUE ...] [--json out.json]
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

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from app_driver import REPO, AppServer, chromium_page, key, open_page, wait_idle  # noqa: E402
from field_args import add_set_argument  # noqa: E402
from machine import load_line, machine_description, machine_line  # noqa: E402

from comlrl_lab.engine.presets import quickstart_spec  # noqa: E402
from comlrl_lab.engine.run import SNAPSHOT_DIR, Run  # noqa: E402
from comlrl_lab.engine.sweep import MANIFEST_FILE, SWEEPS_DIR  # noqa: E402
from comlrl_lab.trainers.preference import MADPOIterConfig  # noqa: E402
from comlrl_lab.ui import state  # noqa: E402

WATCH_TARGET = 1.1  # watched / unwatched: what the page's own polling may cost
APP_CLI_TARGET = 1.05  # a round from the app (page open or closed) against the same round from the CLI
DEFAULT_ROUNDS = 4
POLL_S = 0.5
TIMEOUT_S = 3600


def round_seconds(run_dir: Path, round_index: int) -> float | None:
    """Seconds from round ``round_index - 1``'s evaluate commit to round ``round_index``'s; None until both exist."""
    try:
        rounds = pd.read_parquet(run_dir / SNAPSHOT_DIR / "rounds.parquet").set_index("round")
    except (OSError, ValueError):
        return None
    if round_index not in rounds.index or round_index - 1 not in rounds.index:
        return None
    end, start = rounds.at[round_index, "evaluate_at"], rounds.at[round_index - 1, "evaluate_at"]
    if pd.isna(end) or pd.isna(start):
        return None
    return (end - start).total_seconds()


def round_times(run_dir: Path, rounds: int) -> list[float] | None:
    """The seconds of rounds 2..``rounds`` of a run (round 1 loads the models); None until all have finished."""
    times = [round_seconds(run_dir, index) for index in range(2, rounds + 1)]
    return None if any(seconds is None for seconds in times) else times


def wait_for_rounds(run_dir: Path, rounds: int) -> list[float]:
    deadline = time.monotonic() + TIMEOUT_S
    while (times := round_times(run_dir, rounds)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"round {rounds} of {run_dir.name} did not finish in {TIMEOUT_S} s")
        time.sleep(POLL_S)
    return times


def spec_for(task: str, fields: dict[str, object], rounds: int):
    spec = quickstart_spec(task)
    spec.config.update(fields, num_iterations=rounds)
    return spec


def app_rounds(
    page, server: AppServer, task: str, fields: dict[str, object], rounds: int, *, watched: bool
) -> list[float]:
    """Rounds 2..``rounds`` of a new run started from the Rounds page, the page left open or closed."""
    run = Run.create(spec_for(task, fields, rounds), server.runs_root)
    run.close()  # the app opens it by its id, as a reload would
    page.goto(f"{server.url}/rounds?{state.URL_RUN}={run.run_id}")
    page.locator(f"{key(state.ROUNDS_RUN_ALL)} button:not([disabled])").wait_for()
    wait_idle(page)
    page.locator(f"{key(state.ROUNDS_RUN_ALL)} button").click()
    wait_idle(page)
    if not watched:
        page.goto("about:blank")
    times = wait_for_rounds(run.run_dir, rounds)
    page.goto("about:blank")
    return times


def cli_rounds(scratch: Path, task: str, fields: dict[str, object], rounds: int) -> list[float]:
    """Rounds 2..``rounds`` of a new run made by ``comlrl-lab run`` in its own process."""
    spec_path = scratch / "spec.json"
    spec_for(task, fields, rounds).save(spec_path)
    runs_root = scratch / "cli-runs"
    before = set(runs_root.iterdir()) if runs_root.is_dir() else set()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "comlrl_lab.cli", "run", str(spec_path), "--runs-root", str(runs_root), "--quiet"]
    subprocess.run(command, check=True, env=env, cwd=scratch, stdout=subprocess.DEVNULL)
    (run_dir,) = set(runs_root.iterdir()) - before
    times = round_times(run_dir, rounds)
    if times is None:
        raise RuntimeError(f"the CLI run {run_dir} has no round {rounds}")
    return times


def sweep_rounds(page, server: AppServer, base_run_id: str, cells: int, rounds: int) -> dict[str, list[float]]:
    """Start a sweep of ``cells`` cells from the Compare page; cells alternate watched/unwatched (ABBA)."""
    open_page(page, f"{server.url}/compare?{state.URL_RUN}={base_run_id}", "Compare runs")
    page.locator("[data-testid='stExpander'] summary").filter(has_text="Run a grid").click()
    combo = page.locator(f"{key(state.sweep_field_key(0))} input[role='combobox']")
    combo.click()
    page.keyboard.type("dpo_beta")
    page.locator("[role='option']").filter(has_text="dpo_beta").first.click()
    wait_idle(page)
    for widget_key, text in (
        (state.sweep_values_key(0), "0.2,0.3"),  # not the base run's 0.1: that cell would be the base run itself
        (state.SWEEP_SEEDS, str(max(1, cells // 2))),
        (state.SWEEP_PARALLEL, "1"),
    ):
        box = page.locator(f"{key(widget_key)} input")
        box.fill(text)
        box.press("Tab")
    page.locator(f"{key(state.SWEEP_START)} button").click()
    wait_idle(page)
    compare_url = page.url
    (sweep_dir,) = (server.runs_root / SWEEPS_DIR).iterdir()
    watched_cells = {i for i in range(2 * cells) if i % 4 in (0, 3)}
    times: dict[str, list[float]] = {"watched": [], "unwatched": []}
    shown: bool | None = True
    deadline = time.monotonic() + TIMEOUT_S * cells
    while time.monotonic() < deadline:
        manifest = json.loads((sweep_dir / MANIFEST_FILE).read_text())
        running = [c["index"] for c in manifest["cells"] if c["status"] == "running"]
        if running:
            want = running[0] in watched_cells
            if want != shown:
                page.goto(compare_url if want else "about:blank")
                shown = want
        if all(c["status"] in ("finished", "error", "stopped") for c in manifest["cells"]):
            break
        time.sleep(POLL_S)
    page.goto("about:blank")
    for cell in manifest["cells"]:
        if cell["status"] != "finished":
            raise RuntimeError(f"sweep cell {cell['index']} ended {cell['status']}: {cell.get('error')}")
        cell_times = round_times(server.runs_root / cell["run_id"], rounds) or []
        times["watched" if cell["index"] in watched_cells else "unwatched"].extend(cell_times)
    return times


def ratio_interval(top: list[float], bottom: list[float], *, draws: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """The 95% percentile-bootstrap interval of median(top) / median(bottom), each side resampled on its own.

    Rounds of the same way differ by up to 10% from one run to the next on a shared machine, so the ratio alone can
    read 1.15 on one run and 0.99 on the next; the interval says how far one run's figure can be trusted."""
    rng = np.random.default_rng(seed)
    tops = np.median(rng.choice(np.asarray(top, dtype=float), size=(draws, len(top))), axis=1)
    bottoms = np.median(rng.choice(np.asarray(bottom, dtype=float), size=(draws, len(bottom))), axis=1)
    low, high = np.percentile(tops / bottoms, [2.5, 97.5])
    return float(low), float(high)


def ratio_line(
    name: str, top: list[float], bottom: list[float], target: float
) -> tuple[str, float, tuple[float, float]]:
    """The ratio of the medians, its bootstrap interval and whether the ratio meets ``target``, as one line."""
    value = statistics.median(top) / statistics.median(bottom)
    interval = ratio_interval(top, bottom)
    verdict = "meets" if value <= target else "misses"
    line = f"{name}: {value:.3f}, 95% interval {interval[0]:.3f}-{interval[1]:.3f} ({verdict} the target <= {target})"
    return line, value, interval


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="rounds timed per way (watched, unwatched, cli)")
    parser.add_argument("--sweep-cells", type=int, default=4, help="cells of the Compare-page sweep (0: none)")
    parser.add_argument("--task", default="length_ratio")
    parser.add_argument(
        "--post-script-gc", action="store_true", help="serve with runner.postScriptGC=true (as before the fix)"
    )
    add_set_argument(
        parser,
        MADPOIterConfig,
        "a config field of every run (app and CLI), e.g. gc_freeze_during_steps=false; repeatable",
    )
    parser.add_argument(
        "--rounds", type=int, default=DEFAULT_ROUNDS, help="rounds per run; rounds 2..N are timed (N >= 2)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2: round 1 loads the models and is not timed")
    machine = machine_description()
    print(machine_line(machine), flush=True)
    fields = dict(args.fields)
    if fields:
        print("fields: " + ", ".join(f"{name}={value!r}" for name, value in fields.items()), flush=True)
    options = ("--runner.postScriptGC=true",) if args.post_script_gc else ()
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {"watched": [], "unwatched": [], "cli": []}
    with tempfile.TemporaryDirectory(prefix="watched-round-") as tmp:
        scratch = Path(tmp)
        server = AppServer(scratch / "runs", scratch / "server.log", options=options)
        with server, chromium_page(scratch) as page:
            page.goto(server.url + "/")
            wait_idle(page)
            order = ["watched", "unwatched", "cli"]
            last_app_run = None
            for repeat in range(args.repeats):
                for way in order[repeat % 3 :] + order[: repeat % 3]:
                    if way == "cli":
                        run_times = cli_rounds(scratch, args.task, fields, args.rounds)
                    else:
                        run_times = app_rounds(page, server, args.task, fields, args.rounds, watched=way == "watched")
                        last_app_run = max(p.name for p in server.runs_root.iterdir() if not p.name.startswith("_"))
                    times[way].extend(run_times)
                    took = ", ".join(f"{seconds:.2f}" for seconds in run_times)
                    print(f"{way:>9}: rounds 2-{args.rounds} took {took} s  ({load_line()})", flush=True)
            print("\nmedians (s): " + ", ".join(f"{w} {statistics.median(v):.2f}" for w, v in times.items() if v))
            lines = [ratio_line("watched / unwatched", times["watched"], times["unwatched"], WATCH_TARGET)]
            lines.append(ratio_line("app (page closed) / cli", times["unwatched"], times["cli"], APP_CLI_TARGET))
            lines.append(ratio_line("app (page open) / cli", times["watched"], times["cli"], APP_CLI_TARGET))
            for line, _, _ in lines:
                print(line, flush=True)
            sweep = None
            if args.sweep_cells > 0 and last_app_run is not None:
                sweep = sweep_rounds(page, server, last_app_run, args.sweep_cells, args.rounds)
                for way, values in sweep.items():
                    print(f"sweep cells {way}: {', '.join(f'{v:.2f}' for v in values)} s", flush=True)
                lines.append(
                    ratio_line("sweep cell, Compare open / closed", sweep["watched"], sweep["unwatched"], WATCH_TARGET)
                )
                print(lines[-1][0])
    load_after = os.getloadavg()
    print(
        f"load average before {load_before[0]:.2f} {load_before[1]:.2f}, after {load_after[0]:.2f} {load_after[1]:.2f}"
    )
    result = {
        "machine": machine,
        "rounds": args.rounds,
        "fields": fields,
        "times": times,
        "sweep": sweep,
        "ratios": {line.split(":")[0]: value for line, value, _ in lines},
        "intervals": {line.split(":")[0]: interval for line, _, interval in lines},
        "load_before": load_before,
        "load_after": load_after,
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
