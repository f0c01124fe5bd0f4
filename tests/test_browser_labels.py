"""A human-labelled round in a real browser: collect, label 8 comparisons by keyboard, go on, train on exactly them.

A one-round MADPOIter run with ``preference_source="human"`` on two task items (8 comparisons) is created and
served. In Chromium: the Rounds page runs Collect, then Label, which waits ("awaiting labels"); the Pairs page's
Label tab takes a labeller name and eight verdicts given with the keys 1 2 3 4 (one undone with u and given again,
one skipped with s and come back to), each read off the page with the two sides as shown; "Go on" finishes the
round. The pairs the round trained on (its ``preference_replay/iteration_0001.json``) must be exactly the labelled
winners over the labelled losers, ties and both-bad dropped. Screenshots go to ``test-artifacts/``.

Needs Debian's chromium (or its headless shell); skipped otherwise.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

import pytest
from browser_support import ARTIFACTS, BROWSER, app_driver
from workbench_fixtures import agent_model, seed_spec

from comlrl_lab.engine import RunManager
from comlrl_lab.ui import state

pytestmark = pytest.mark.browser

driver = app_driver()
key = driver.key

#: The verdict keys pressed on comparisons 1..8, in order (tie and both bad are dropped from training).
PRESSED = ["1", "2", "3", "1", "4", "2", "1", "2"]
VERDICT_OF_KEY = {"1": "A", "2": "B", "3": "tie", "4": "both_bad"}


def _shoot(page, name: str) -> Path:
    return driver.screenshot(page, ARTIFACTS / f"{name}.png")


def _label_progress(page) -> str:
    return page.locator("[data-testid=stMain] [data-testid=stProgress]").first.inner_text()


def _shown(page) -> tuple[int, list[str], list[str]]:
    """(comparison number, agents' texts of A, of B) as the page shows them now."""
    shown = page.locator(key(state.LABEL_COMPARISON)).first.inner_text()
    number = int(re.search(r"Comparison (\d+) of 8", shown).group(1))
    sides = [
        [code.inner_text().strip() for code in page.locator(f"{key(state.label_side_key(name))} pre").all()]
        for name in ("A", "B")
    ]
    return number, sides[0], sides[1]


def _button(page, widget_key: str):
    """The button keyed ``widget_key``: the first, as a rerun can leave a stale copy drawn for a moment."""
    return page.locator(f"{key(widget_key)} button").first


def _reload_until(page, url: str, ready, started_by: str, timeout_s: float, pause_ms: int = 1000) -> None:
    """Reload ``url`` until ``ready(page)`` holds, clicking the button keyed ``started_by`` again while it is enabled.

    The wait follows a click on that button. On a loaded machine the click can land on a copy of the button a rerun
    is about to replace, and nothing starts; the button then shows enabled after a reload (a running phase disables
    it, a finished one moves the run past it), and is clicked again."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        page.goto(url)
        page.locator("h1").first.wait_for()
        driver.wait_idle(page, started_within_ms=0)
        if ready(page):
            return
        starter = page.locator(f"{key(started_by)} button")
        if starter.count() and _button(page, started_by).is_enabled():
            _button(page, started_by).click()
            driver.wait_idle(page)
        # Look again every quarter second until the next reload: a condition on files, or on a page that redraws
        # itself, holds well before the reload would show it.
        next_reload = time.monotonic() + pause_ms / 1000
        while time.monotonic() < next_reload:
            page.wait_for_timeout(250)
            if ready(page):
                return
    raise AssertionError(f"{url} did not get ready within {timeout_s}s of clicking {started_by}")


def _wait_enabled(page, url: str, widget_key: str, started_by: str, timeout_s: float = 300) -> None:
    """Reload ``url`` until the button keyed ``widget_key`` is enabled (a phase runs in the server's worker)."""

    def enabled(page) -> bool:
        return bool(page.locator(f"{key(widget_key)} button").count()) and _button(page, widget_key).is_enabled()

    _reload_until(page, url, enabled, started_by, timeout_s)


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("labels")
    runs = tmp / "runs"
    spec = dataclasses.replace(
        seed_spec(agent_model(tmp_path_factory.mktemp("model")), num_iterations=1, preference_source="human"),
        name="labelled",
        max_train_items=2,
    )
    manager = RunManager(runs)
    try:
        run_id = manager.create(spec)
    finally:
        manager.close()
    with driver.AppServer(runs, tmp / "server.log") as server, driver.chromium_page(tmp, executable=BROWSER) as page:
        yield server, page, run_id, runs / run_id


def test_a_human_round_is_labelled_by_keyboard_and_trains_on_exactly_the_labelled_winners(app):
    server, page, run_id, run_dir = app
    rounds_url = (
        f"{server.url}/rounds?run.open={run_id}"  # lowercase: a fresh server's first visit (test_browser_addresses)
    )
    driver.open_page(page, rounds_url, "Rounds")
    # The round has five phases: Label sits between Collect and Select.
    buttons = [_button(page, state.phase_button_key(p)).inner_text() for p in ("collect", "label")]
    assert buttons == ["Collect", "Label"]
    _button(page, state.phase_button_key("collect")).click()
    _wait_enabled(page, rounds_url, state.phase_button_key("label"), started_by=state.phase_button_key("collect"))
    _button(page, state.phase_button_key("label")).click()
    _reload_until(
        page,
        rounds_url,
        lambda page: bool(page.get_by_text("awaiting labels").count()),
        started_by=state.phase_button_key("label"),
        timeout_s=300,
    )
    assert page.get_by_text("round 1 waits for labels: 8 of 8 comparisons still need a label").count()
    driver.wait_idle(page)
    page.wait_for_timeout(1500)
    _shoot(page, "labels-rounds-awaiting")

    driver.open_page(page, f"{server.url}/Pairs?run.open={run_id}", "Pairs")
    assert page.locator(key(state.LABEL_GUIDELINE)).inner_text().startswith("Guideline")
    name = page.locator(f"{key(state.LABEL_LABELLER)} input")
    name.fill("ann")
    name.press("Enter")
    driver.wait_idle(page)
    # The focus leaves the name box for the comparison, so the first key pressed is a verdict, not more name.
    page.wait_for_function(
        "(sel) => document.querySelector(sel)?.contains(document.activeElement)",
        arg=key(state.LABEL_COMPARISON),
        timeout=10_000,
    )
    assert name.input_value() == "ann"

    seen: dict[int, tuple[list[str], list[str]]] = {}
    given: dict[int, str] = {}

    def press(k: str) -> None:
        page.keyboard.press(k)
        driver.wait_idle(page)

    for step, k in enumerate(PRESSED):
        number, a, b = _shown(page)
        assert number == step + 1
        seen[number] = (a, b)
        if step == 1:  # a verdict undone with u shows its comparison again
            press("3")
            assert _label_progress(page).startswith("2 of 8")
            press("u")
            assert _shown(page)[0] == 2 and _label_progress(page).startswith("1 of 8")
        if step == 3:
            _shoot(page, "labels-labelling-view")
        if step == 7:  # the last one is skipped first, then come back to
            press("s")
            assert page.get_by_text("You skipped 1 comparison and labelled the rest.").count()
            _button(page, state.LABEL_UNSKIP).click()
            driver.wait_idle(page)
            assert _shown(page)[0] == 8
        press(k)
        if step == 0:
            assert name.input_value() == "ann"  # the first key went to the comparison
        given[number] = VERDICT_OF_KEY[k]
        assert _label_progress(page).startswith(f"{step + 1} of 8")
    assert page.get_by_text("All 8 comparisons of round 1 have their labels.").count()
    assert page.get_by_text("Cohen's κ vs reward").count()
    _shoot(page, "labels-all-labelled")

    _button(page, state.LABEL_GO_ON).click()
    replay_file = run_dir / "preference_replay" / "iteration_0001.json"
    manifest = run_dir / "snapshots" / "_manifest.json"
    _reload_until(
        page,
        f"{server.url}/Pairs?run.open={run_id}",
        lambda _: manifest.exists() and "0001_evaluate" in manifest.read_text(),
        started_by=state.LABEL_GO_ON,
        timeout_s=600,
        pause_ms=5000,
    )
    trained = json.loads(replay_file.read_text())["pairs"]
    expected = [(a, b) if given[n] == "A" else (b, a) for n, (a, b) in sorted(seen.items()) if given[n] in ("A", "B")]
    got = [([t.strip() for t in r["winner_completions"]], [t.strip() for t in r["loser_completions"]]) for r in trained]
    assert got == expected and len(got) == 6

    page.goto(rounds_url)
    page.locator("h1").filter(has_text="Rounds").wait_for()
    page.get_by_text("All rounds finished.").first.wait_for(timeout=120_000)
    driver.wait_idle(page)
    _shoot(page, "labels-rounds-finished")
