"""The workbench in a real browser, as a new user would use it (Playwright driving Debian chromium).

Open the app, pick the tiny model and a built-in task, set up MADPOIter with a history comparator and
lambda_decay, run two rounds; while a training phase runs, switch pages and time how long each one takes to
draw; open a pair and see both sides; move λ and see the weights change; export Parquet and read the file
back; on the Compare page, ask whether nearest_k replay beats lambda_decay as one grid (two modes, two seeds) from
that run and see the answer in numbers, then submit more seeds of that run to Slurm (``fake_slurm.py`` runs the job
array here) and see the page fill in; archive one of the runs from Setup's run list.
Screenshots of every page and the measured page-switch latencies go to ``test-artifacts/``.

Each step is its own test, run in file order on one page that the next step continues from; once a step fails,
the later ones skip (``failed_step``, set by the hook in conftest.py), so the report names the step that broke.

Needs Debian's chromium (``apt-get install chromium chromium-headless-shell``); skipped with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import parse_qs, urlparse

import fake_slurm
import pandas as pd
import pytest
from browser_support import ARTIFACTS, BROWSER, app_driver, require_browser
from workbench_fixtures import agent_model

from comlrl_lab.models.tiny_model import TINY_MODEL_NAME
from comlrl_lab.trainers.preference.rounds.replay import lambda_decay_weights
from comlrl_lab.ui import model_picker, state

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
IDLE = '[data-testid="stApp"][data-test-script-state="notRunning"]'
#: The acceptance bound: a click on another page draws it within this many seconds, even during training.
SWITCH_BOUND_S = 2.0

sync_api = require_browser()

#: Name of the first step that failed; conftest.py's report hook sets it.
failed_step: str | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``streamlit run app.py`` on a free local port with an empty runs folder; stopped by its PID after."""
    tmp = tmp_path_factory.mktemp("browser")
    port = _free_port()
    slurm_bin = fake_slurm.install(tmp / "slurm", run_jobs=True)  # so Run a grid offers Slurm, run on this machine
    env = dict(
        os.environ,
        PATH=f"{slurm_bin}{os.pathsep}{os.environ['PATH']}",
        COMLRL_LAB_RUNS_DIR=str(tmp / "runs"),
        XDG_CONFIG_HOME=str(tmp / "xdg-config"),
        XDG_CACHE_HOME=str(tmp / "xdg-cache"),
        PYTHONUNBUFFERED="1",
    )
    log = open(tmp / "server.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            "app.py",
            "--server.headless",
            "true",
            "--server.address",
            "127.0.0.1",
            "--server.port",
            str(port),
            "--browser.gatherUsageStats",
            "false",
            "--server.fileWatcherType",
            "none",
        ],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read() == b"ok":
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"streamlit did not start:\n{(tmp / 'server.log').read_text()}")
            time.sleep(0.2)
        yield {"url": url, "tmp": tmp}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def browser_page(server):
    with app_driver().chromium_page(
        server["tmp"], executable=BROWSER, accept_downloads=True, timeout_ms=60_000
    ) as page:
        yield page


# -- helpers ------------------------------------------------------------------------------------------------


def settle(page, *, drawn: bool = False) -> None:
    """Wait for the rerun an action caused to start (if it has not finished already), then for the script to idle.
    ``drawn`` where something that rerun draws has been waited for: only its end is left to wait for."""
    app_driver().wait_idle(page, started_within_ms=0 if drawn else 1000)


def key(name: str) -> str:
    """CSS selector of the container of the element keyed ``name`` (Streamlit writes dots as hyphens)."""
    return ".st-key-" + name.replace(".", "-")


def fill_number(page, widget_key: str, value) -> None:
    box = page.locator(f"{key(widget_key)} input")
    box.fill(str(value))
    box.press("Enter")
    settle(page)


def fill_form(page, *values: tuple[str, str]) -> None:
    """Type each (widget key, text) into a form's inputs; inside a form Enter would submit it, so Tab commits each."""
    for widget_key, text in values:
        box = page.locator(f"{key(widget_key)} input")
        box.fill(text)
        box.press("Tab")


def choose(page, widget_key: str, option: str | int) -> None:
    """Pick ``option`` (its text, or its position) in the selectbox keyed ``widget_key``."""
    for attempt in range(3):
        page.wait_for_selector(IDLE, timeout=120_000)
        page.locator(f"{key(widget_key)} input[role='combobox']").click()
        try:
            options = page.locator("[role='option']")
            target = options.nth(option) if isinstance(option, int) else options.filter(has_text=option).first
            target.click(timeout=3000)
            break
        except sync_api.TimeoutError:  # the list closed under a late rerun: try again
            if attempt == 2:
                raise
            page.keyboard.press("Escape")
    settle(page)


def _setup_form(page) -> dict:
    """What the Setup widgets the first step changes show, read from the page."""
    read = {}
    for name in ("num_iterations", "max_new_tokens", "num_train_epochs", "preference_replay_lambda"):
        read[name] = page.locator(f"{key(state.config_field_key('MADPOIter', name))} input").input_value()
    for name in ("comparator_policy", "preference_replay_mode"):
        combo = f"{key(state.config_field_key('MADPOIter', name))} input[role='combobox']"
        read[name] = page.locator(combo).input_value()
    read["task"] = page.locator(f"{key(state.SETUP_TASK)} input[role='combobox']").input_value()
    read["max_train_items"] = page.locator(f"{key(state.SETUP_MAX_TRAIN_ITEMS)} input").input_value()
    read["max_eval_items"] = page.locator(f"{key(state.SETUP_MAX_EVAL_ITEMS)} input").input_value()
    toggle = f"{key(state.config_field_key('MADPOIter', 'madpo_length_normalize'))} input"
    read["madpo_length_normalize"] = page.locator(toggle).is_checked()
    return read


def nav(page, title: str):
    return page.locator("[data-testid='stSidebarNav'] a").filter(has_text=title).first


def shoot(page, name: str) -> Path:
    """A screenshot of the whole main area (the viewport is stretched to its height first)."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.wait_for_timeout(600)
    height = page.evaluate("document.querySelector('[data-testid=stMain]').scrollHeight")
    page.set_viewport_size({"width": 1400, "height": max(1000, min(int(height) + 40, 7000))})
    page.wait_for_timeout(700)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path))
    page.set_viewport_size({"width": 1400, "height": 1000})
    return path


def quiet(page, timeout_s: float = 20.0) -> None:
    """Wait until the current page has finished drawing: the script idle at two checks 150 ms apart (the live
    progress fragments rerun every second or two while a round trains, so one check could catch a gap)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if page.locator(IDLE).count():
            page.wait_for_timeout(150)
            if page.locator(IDLE).count():
                return
        page.wait_for_timeout(100)


def switch_and_time(page, title: str, ready_selector: str) -> dict:
    """After the current page has drawn, click another page in the sidebar; seconds until its title is drawn,
    and until ``ready_selector`` (its first table or chart) is visible."""
    quiet(page)
    card = page.locator("[data-testid='stSidebar'] [data-testid='stProgress']")
    during = card.first.inner_text().strip() if card.count() else "(no phase running)"
    started = time.perf_counter()
    nav(page, title).click()
    page.locator("h1").filter(has_text=title).first.wait_for(state="visible", timeout=30_000)
    title_s = time.perf_counter() - started
    page.locator(ready_selector).first.wait_for(state="visible", timeout=30_000)
    return {
        "page": title,
        "title_s": round(title_s, 3),
        "content_s": round(time.perf_counter() - started, 3),
        "during": during,
    }


# -- the steps -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def journey():
    """What one step hands to a later one."""
    return SimpleNamespace(during_training=[])


@pytest.fixture(autouse=True)
def _after_the_earlier_steps():
    if failed_step is not None:
        pytest.skip(f"continues from the page of step {failed_step}, which failed")


def test_setup_page_configures_madpo_iter_and_creates_the_run(server, browser_page, tmp_path):
    page = browser_page
    # Setup has an address of its own (a bookmark, a link); the root moves on to it.
    app_driver().open_page(page, server["url"] + "/setup", "Set up an experiment")
    assert not page.get_by_text("Page not found").count()
    app_driver().open_page(page, server["url"] + "/", "Set up an experiment")
    assert page.url.split("?")[0].endswith("/setup")

    # Agents: the embedded tiny model (a random tiny Llama by local path when the embedded one is not built).
    model = agent_model(tmp_path)
    if model != TINY_MODEL_NAME:
        for i in range(2):
            choose(page, state.agent_source_key(i), model_picker.OTHER)
            box = page.locator(f"{key(state.agent_model_key(i))} input")
            box.fill(model)
            box.press("Enter")
            settle(page)
    else:
        for i in range(2):
            picked = page.locator(f"{key(state.agent_source_key(i))} input[role='combobox']").input_value()
            assert picked.startswith(TINY_MODEL_NAME)

    # Task: a built-in one, first 8 training and 4 evaluation items.
    choose(page, state.SETUP_TASK, "Length ratio")
    fill_number(page, state.SETUP_MAX_TRAIN_ITEMS, 8)
    fill_number(page, state.SETUP_MAX_EVAL_ITEMS, 4)

    # Algorithm: MADPO, iterative (the defaults), small rounds.
    page.locator(f"{key(state.SETUP_FAMILY)} button").filter(has_text="MADPO").click()
    settle(page)
    assert page.locator(f"{key(state.SETUP_ITERATIVE)} input").is_checked()
    fill_number(page, state.config_field_key("MADPOIter", "num_iterations"), 2)
    fill_number(page, state.config_field_key("MADPOIter", "preference_num_candidates"), 4)
    fill_number(page, state.config_field_key("MADPOIter", "max_new_tokens"), 12)
    # A training phase long enough to switch pages in: the sidebar's progress card redraws every SIDEBAR_POLL_S (5 s)
    # away from the Rounds page, and at 4 epochs a round's training ended before the first switch on a fast CPU. At
    # 24 epochs (96 steps in round 1) the four switches all fell within its first 19 steps on an AMD EPYC; 8 epochs
    # (32 steps) leave room for a CPU twice as fast, and one switch is what the step needs. The grid and Slurm cells
    # below inherit the setting, so every epoch here is paid six times over.
    fill_number(page, state.config_field_key("MADPOIter", "num_train_epochs"), 8)

    # Comparator: history. Replay: nearest_k with k = 3 first, then a switch back to lambda_decay: the k left
    # behind does not block creation, and λ is 0.5 again (the quickstart preset's; when λ was never set the form
    # fills in 0.5 and says so, which tests/test_setup_form.py checks).
    choose(page, state.config_field_key("MADPOIter", "comparator_policy"), "history")
    choose(page, state.config_field_key("MADPOIter", "preference_replay_mode"), "nearest_k")
    fill_number(page, state.config_field_key("MADPOIter", "preference_replay_k"), 3)
    page.get_by_text("MADPOIterConfig is valid.").wait_for()
    choose(page, state.config_field_key("MADPOIter", "preference_replay_mode"), "lambda_decay")
    page.get_by_text("MADPOIterConfig is valid.").wait_for()
    assert not page.locator(key(state.config_field_key("MADPOIter", "preference_replay_k"))).count()
    lam_box = page.locator(f"{key(state.config_field_key('MADPOIter', 'preference_replay_lambda'))} input")
    assert lam_box.input_value() == "0.5"
    assert page.locator(f"{key(state.SETUP_CREATE)} button").is_enabled()

    # A toggle turned off: the MADPO stabiliser the quickstart preset turns on.
    normalize = key(state.config_field_key("MADPOIter", "madpo_length_normalize"))
    page.locator("[data-testid='stExpander'] summary").filter(has_text="MADPO stabilisers").click()
    toggle = page.locator(f"{normalize} input")
    for _ in range(3):  # a rerun still on its way from the step before can draw the toggle again
        page.locator(f"{normalize} label").click()
        settle(page)
        with contextlib.suppress(AssertionError):
            sync_api.expect(toggle).not_to_be_checked(timeout=5_000)
            break
    assert not toggle.is_checked()

    # The draft is in the URL (what differs from the preset), and a reload brings the same form back.
    wanted = {
        state.config_field_key("MADPOIter", "num_iterations"): "2",
        state.config_field_key("MADPOIter", "comparator_policy"): "history",
        state.config_field_key("MADPOIter", "madpo_length_normalize"): "false",
        state.SETUP_MAX_TRAIN_ITEMS: "8",
        state.SETUP_MAX_EVAL_ITEMS: "4",
    }
    page.wait_for_function(
        "(wanted) => { const q = new URLSearchParams(location.search);"
        " return Object.entries(wanted).every(([k, v]) => q.get(k) === v); }",
        arg=wanted,
        timeout=30_000,
    )
    before = _setup_form(page)
    page.reload()
    page.locator(f"{key(state.config_field_key('MADPOIter', 'num_iterations'))} input").wait_for()
    settle(page, drawn=True)
    assert _setup_form(page) == before
    assert before["num_iterations"] == "2" and before["comparator_policy"] == "history"
    assert before["preference_replay_mode"] == "lambda_decay" and before["preference_replay_lambda"] == "0.5"
    assert before["madpo_length_normalize"] is False and before["max_eval_items"] == "4"
    page.get_by_text("MADPOIterConfig is valid.").wait_for()
    assert page.locator(f"{key(state.SETUP_CREATE)} button").is_enabled()
    shoot(page, "01-setup")

    page.locator(f"{key(state.SETUP_CREATE)} button").click()
    app_driver().page_drawn(page, "Rounds")


def test_pages_switch_while_a_training_phase_runs(server, browser_page, journey):
    page = browser_page
    fill_number(page, state.ROUNDS_COUNT, 2)
    for attempt in range(3):  # a click that lands while the page redraws is lost: click until the run starts
        page.wait_for_selector(IDLE, timeout=120_000)
        page.locator(f"{key(state.ROUNDS_RUN_ROUNDS)} button").click()
        try:
            started = page.locator(f"{key(state.ROUNDS_RUN_ROUNDS)} button[disabled]").or_(
                page.get_by_text("All rounds finished.")
            )
            started.first.wait_for(timeout=15_000)
            break
        except sync_api.TimeoutError:
            if attempt == 2:
                raise
    card = page.locator("[data-testid='stSidebar'] [data-testid='stProgress']")
    switches = [
        ("Pairs", "[data-testid='stDataFrame']"),
        ("Learning", "[data-testid='stPlotlyChart']"),
        ("Replay", "[data-testid='stPlotlyChart']"),
        ("Rounds", key(state.ROUNDS_PROGRESS)),
    ]
    latencies: list[dict] = []
    shot = False
    deadline = time.monotonic() + float(os.environ.get("COMLRL_LAB_BROWSER_RUN_S", "600"))
    while time.monotonic() < deadline and sum("Train" in e["during"] for e in latencies) < len(switches):
        try:  # the card can vanish between count() and the read when a phase ends: read it as empty then
            text = card.first.inner_text(timeout=2_000) if card.count() else ""
        except sync_api.TimeoutError:
            text = ""
        if "Train" in text:
            if not shot and page.locator("h1").filter(has_text="Rounds").count():
                shoot(page, "02-rounds-training")
                shot = True
            latencies.append(switch_and_time(page, *switches[len(latencies) % len(switches)]))
        elif page.get_by_text("All rounds finished.").count() or page.get_by_text("The last phase failed").count():
            break
        else:
            page.wait_for_timeout(200)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "page_switch_latency.json").write_text(json.dumps(latencies, indent=2, ensure_ascii=False))
    print("page switches while a round ran:", json.dumps(latencies, ensure_ascii=False))
    journey.during_training = [e for e in latencies if "Train" in e["during"]]
    if not journey.during_training:
        shoot(page, "99-no-training-seen")
        print((server["tmp"] / "server.log").read_text()[-5000:])
    assert journey.during_training, "never switched pages while a training phase was running"


def test_rounds_page_shows_both_rounds_finished(browser_page):
    page = browser_page
    nav(page, "Rounds").click()
    page.locator("h1").filter(has_text="Rounds").wait_for()
    page.get_by_text("All rounds finished.").first.wait_for(timeout=600_000)
    settle(page)
    page.wait_for_selector("[data-testid='stPlotlyChart']")
    shoot(page, "03-rounds-finished")
    assert page.locator("[data-testid='stMetricValue']").first.inner_text().strip() == "2 / 2"


def test_pairs_page_opens_a_pair_with_winner_and_loser_of_both_agents(browser_page):
    page = browser_page
    nav(page, "Pairs").click()
    app_driver().page_drawn(page, "Pairs")
    choose(page, state.PAIRS_OPEN, 1)  # the second pair on the page
    page.locator("h2, h3").filter(has_text="pair 1").first.wait_for()
    for i in range(2):
        winner = page.locator(key(state.pair_agent_key(i, "winner")))
        loser = page.locator(key(state.pair_agent_key(i, "loser")))
        assert winner.is_visible() and loser.is_visible()
        assert "Winner" in winner.inner_text() and "Loser" in loser.inner_text()
    shoot(page, "04-pairs")

    # A reload (a bookmark, a link to a colleague) comes back to the same page of the same run.
    run_id = parse_qs(urlparse(page.url).query)[state.URL_RUN][0]
    assert page.url.split("?")[0].endswith("/pairs")
    app_driver().open_page(page, None, "Pairs")
    page.locator("[data-testid='stDataFrame']").first.wait_for()
    assert parse_qs(urlparse(page.url).query)[state.URL_RUN] == [run_id]
    assert run_id in page.locator(f"{key(state.SIDEBAR_RUN)} input").input_value()
    page.locator("[data-testid='stMarkdownContainer']", has_text="pairs match").first.wait_for(state="visible")


def test_replay_page_weights_follow_the_lambda_slider(browser_page):
    page = browser_page
    nav(page, "Replay").click()
    app_driver().page_drawn(page, "Replay buffer")
    weights = page.locator(key(state.REPLAY_LAMBDA_TEXT))
    w = lambda_decay_weights(2, 0.5)
    assert weights.inner_text().strip() == f"round 1: {w[0]:.3f} · round 2: {w[1]:.3f}"
    thumb = page.locator(f"{key(state.REPLAY_LAMBDA)} input[type='range']")
    thumb.focus()
    for _ in range(30):
        thumb.press("ArrowRight")
    settle(page)
    quiet(page)
    moved = float(thumb.input_value())
    assert moved == pytest.approx(0.8)
    w = lambda_decay_weights(2, moved)
    page.wait_for_function(
        "([sel, want]) => document.querySelector(sel)?.innerText.trim() === want",
        arg=[key(state.REPLAY_LAMBDA_TEXT), f"round 1: {w[0]:.3f} · round 2: {w[1]:.3f}"],
    )
    shoot(page, "05-replay")

    # A hundred quick presses: the tables end in step with the slider, not a few reruns behind.
    for _ in range(100):
        thumb.press("ArrowLeft")
    settle(page)
    quiet(page)
    assert float(thumb.input_value()) == 0.0
    w = lambda_decay_weights(2, 0.0)
    page.wait_for_function(
        "([sel, want]) => document.querySelector(sel)?.innerText.trim() === want",
        arg=[key(state.REPLAY_LAMBDA_TEXT), f"round 1: {w[0]:.3f} · round 2: {w[1]:.3f}"],
        timeout=30_000,
    )


def test_learning_page_draws_its_charts(browser_page):
    page = browser_page
    nav(page, "Learning").click()
    app_driver().page_drawn(page, "Learning")
    page.wait_for_selector("[data-testid='stPlotlyChart']")
    assert page.locator("[data-testid='stPlotlyChart']").count() >= 5
    shoot(page, "06-learning")


def test_data_page_exports_parquet_that_reads_back(browser_page, tmp_path):
    page = browser_page
    nav(page, "Data").click()
    app_driver().page_drawn(page, "Data")
    page.locator(key(state.EXPORT_FORMAT)).get_by_text("Parquet").click()
    settle(page)
    announced = page.get_by_text("will be exported").first.inner_text()
    count = int(announced.split()[0].replace(",", ""))
    page.locator(f"{key(state.EXPORT_BUILD)} button").click()
    settle(page)
    with page.expect_download() as download_info:
        page.locator(f"{key(state.EXPORT_DOWNLOAD)} button").click()
    saved = tmp_path / download_info.value.suggested_filename
    download_info.value.save_as(saved)
    frame = pd.read_parquet(saved)
    assert len(frame) == count > 0
    assert {"prompts", "winner_completions", "loser_completions", "winner_reward", "loser_reward"} <= set(frame.columns)
    shoot(page, "07-data")


def test_compare_page_answers_the_replay_mode_question_as_one_grid(server, browser_page):
    """nearest_k against lambda_decay over two seeds, from the run made above (lambda_decay, λ 0.5), started from
    the Compare page as one grid: nearest_k gets its k, the base run is the lambda_decay cell of its own seed, and
    the answer comes as numbers with CIs."""
    page = browser_page
    # By its address: the Pairs link's icon is the "compare" glyph, whose text matches the title too.
    page.locator("[data-testid='stSidebarNav'] a[href$='/compare']").click()
    app_driver().page_drawn(page, "Compare runs")
    page.locator("[data-testid='stExpander'] summary").filter(has_text="Run a grid").click()
    # The list of config fields is long and drawn only in part: type to bring the option up.
    combo = page.locator(f"{key(state.sweep_field_key(0))} input[role='combobox']")
    for attempt in range(3):
        page.wait_for_selector(IDLE, timeout=120_000)
        combo.click()
        page.keyboard.type("preference_replay_mode")
        try:
            page.locator("[role='option']").filter(has_text="preference_replay_mode").first.click(timeout=5_000)
            break
        except sync_api.TimeoutError:  # the list was redrawn under a late rerun: try again
            if attempt == 2:
                raise
            page.keyboard.press("Escape")
    settle(page)
    fill_form(page, (state.SWEEP_SEEDS, "2"), (state.SWEEP_PARALLEL, "2"))
    # Enter in a Values box commits the text; it does not start the grid.
    values = page.locator(f"{key(state.sweep_values_key(0))} input")
    values.fill("nearest_k,lambda_decay")
    values.press("Enter")
    settle(page)
    sweeps = server["tmp"] / "runs" / "_sweeps"
    assert not sweeps.exists() or not any(sweeps.iterdir())
    page.locator(f"{key(state.SWEEP_START)} button").click()
    settle(page)
    page.get_by_text("The sweep has finished").wait_for(timeout=900_000)
    settle(page)
    (sweep_dir,) = sweeps.iterdir()
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    cells = manifest["cells"]
    assert [c["status"] for c in cells] == ["finished"] * 4
    assert [{k: v for k, v in c["overrides"].items() if k != "seed"} for c in cells] == [
        {"preference_replay_mode": "nearest_k", "preference_replay_k": 2, "preference_replay_lambda": None},
        {"preference_replay_mode": "nearest_k", "preference_replay_k": 2, "preference_replay_lambda": None},
        {"preference_replay_mode": "lambda_decay"},
        {"preference_replay_mode": "lambda_decay"},
    ]
    base_run = json.loads((server["tmp"] / "runs" / cells[2]["run_id"] / "spec.json").read_text())
    assert sweep_dir.name not in base_run["tags"]  # the run made on Setup, not run again
    assert page.locator(key(state.COMPARE_TAGS)).get_by_text(sweep_dir.name).count() >= 1
    # The numbers: each group's final and best evaluation with n, and the difference of the two modes with its CI,
    # paired by seed (both ran the same two seeds). A is lambda_decay (the run made on Setup comes first).
    page.get_by_text("Evaluation reward: final and best").first.wait_for()
    answer = page.locator("[data-testid='stMarkdown']").filter(has_text="A − B at round 2").first
    answer.wait_for()
    assert "95% CI" in answer.inner_text() and "paired by seed over the 2 seeds" in answer.inner_text()
    page.wait_for_selector("[data-testid='stPlotlyChart']")
    legend = page.locator("[data-testid='stPlotlyChart'] .legendtext")
    assert any("preference_replay_k=2" in text for text in legend.all_text_contents())
    assert page.locator("[data-testid='stPlotlyChart']").count() >= 3  # curves, gaps, winner side
    shoot(page, "08-compare")


def test_compare_page_submits_more_seeds_to_slurm_and_follows_them_as_they_fill_in(server, browser_page):
    """More seeds of the base run, no field, through the Slurm launcher (tests/fake_slurm.py runs the job array
    here): the base run counts as the first seed, so two jobs go out; the page shows them queued, running and
    finished as the jobs commit them, and then the group compared."""
    page = browser_page
    page.locator(f"{key(state.SWEEP_LAUNCHER)} label").filter(has_text="Slurm cluster").click()
    settle(page)
    fill_form(
        page,
        (state.sweep_values_key(0), ""),  # the field stays chosen; without values it is no part of the grid
        (state.SWEEP_SEEDS, "3"),
        (state.SWEEP_PARALLEL, "2"),
        (state.SWEEP_TIME, "30"),
        (state.SWEEP_GPUS, "0"),
    )
    page.locator(f"{key(state.SWEEP_START)} button").click()
    settle(page)
    sweeps = server["tmp"] / "runs" / "_sweeps"
    (sweep_dir,) = (
        p for p in sweeps.iterdir() if json.loads((p / "sweep.json").read_text())["launcher"]["kind"] == "slurm"
    )
    # Part way: the base run counts as finished, the jobs' cells running or queued.
    page.get_by_text(re.compile(r"[12]/3 runs finished")).first.wait_for(timeout=900_000)
    settle(page)
    shoot(page, "10-compare-slurm-filling-in")
    page.get_by_text("The sweep has finished").wait_for(timeout=900_000)
    settle(page)
    manifest = json.loads((sweep_dir / "sweep.json").read_text())
    cells = manifest["cells"]
    assert [list(c["overrides"]) for c in cells] == [["seed"]] * 3
    assert [c["status"] for c in cells] == ["finished"] * 3
    assert [c["job_id"] for c in cells] == [None, "4242_0", "4242_1"]  # the base run needs no job
    assert page.locator(key(state.COMPARE_TAGS)).get_by_text(sweep_dir.name).count() >= 1
    assert page.get_by_text("comlrl-lab sweep status").count() >= 1
    page.wait_for_selector("[data-testid='stPlotlyChart']")
    shoot(page, "11-compare-slurm")


def test_setup_run_list_archives_a_run_behind_the_confirmation(server, browser_page):
    page = browser_page
    nav(page, "Setup").click()
    app_driver().page_drawn(page, "Set up an experiment")
    page.locator("[data-testid='stExpander'] summary").filter(has_text="Your runs").click()
    settle(page)
    # Reruns that redraw the table (a sort, the confirmation) keep the list open: it used to close and hide the
    # buttons. Oldest first, the last is a run of the sweep above, not the open run.
    choose(page, state.RUNS_SORT, "oldest first")
    choose(page, state.RUNS_PICK, -1)
    run_id = page.locator(f"{key(state.RUNS_PICK)} input[role='combobox']").input_value().split(" — ")[0]
    archive = page.locator(f"{key(state.RUNS_ARCHIVE)} button")
    assert archive.is_disabled()
    page.locator(f"{key(state.RUNS_CONFIRM)} label").click()
    settle(page)
    assert archive.is_visible() and archive.is_enabled()
    shoot(page, "09-run-list")
    archive.click(timeout=15_000)
    page.get_by_text(f"Archived {run_id}").first.wait_for()
    runs = server["tmp"] / "runs"
    assert (runs / "_archive" / run_id / "spec.json").is_file() and not (runs / run_id).exists()


def test_page_switches_during_training_were_within_the_bound(journey):
    # Checked last, so a slow machine still gets every step's screenshot.
    slow = [entry for entry in journey.during_training if entry["title_s"] > SWITCH_BOUND_S]
    assert not slow, f"page switches slower than {SWITCH_BOUND_S}s during training: {slow}"
