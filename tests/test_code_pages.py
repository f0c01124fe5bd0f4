"""The workbench on a humaneval run: why a pair won (each side's level summary and program on the Pairs page).

The run is made without a model (``code_fixtures``): known completions scored by the real reward in the sandbox.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import streamlit as st
from code_fixtures import (
    IDENTITY_REWARD,
    IDENTITY_SUMMARY,
    MAIN_IDENTITY,
    MAIN_USES,
    USES_REWARD,
    USES_SUMMARY,
    seed_code_run,
)
from streamlit.testing.v1 import AppTest

from comlrl_lab.ui import forms, frames, services, state

APP = str(Path(__file__).resolve().parents[1] / "app.py")
TIMEOUT = 60


@pytest.fixture(scope="module")
def code_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return root, seed_code_run(root)


def _fresh_cache() -> None:
    services.close_all()
    st.cache_resource.clear()
    st.cache_data.clear()


@pytest.fixture
def open_page(code_run, monkeypatch):
    root, run_id = code_run

    def make(page: str) -> AppTest:
        monkeypatch.setenv(services.RUNS_DIR_ENV, str(root))
        at = AppTest.from_file(APP, default_timeout=TIMEOUT)
        at.session_state[state.SETUP_PRESET] = forms.PRESET_NONE
        at.session_state[state.RUN_ID] = run_id
        at.run()
        at.switch_page(page).run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    _fresh_cache()
    yield make
    _fresh_cache()


def _inside(at: AppTest, key: str, kind: str) -> list:
    """The elements of ``kind`` (markdown, caption, code) anywhere inside the block keyed ``key``."""

    def walk(node):
        for child in getattr(node, "children", {}).values():
            if getattr(child, "type", None) == kind:
                yield child
            yield from walk(child)

    return list(walk(at.get_by_key(key)))


def test_breakdown_summary_reads_a_summary_or_the_fields():
    assert frames.breakdown_summary({"summary": "parses · 5/7 tests · uses aux", "reward": 3.2}) == (
        "parses · 5/7 tests · uses aux"
    )
    assert frames.breakdown_summary({"matched": 3, "reward": 0.5, "error": ""}) == "matched: 3"
    assert frames.breakdown_summary(None) == ""
    assert frames.breakdown_column(['{"summary": "does not parse"}', None]) == ["does not parse", ""]


def test_pairs_show_why_the_winner_won_with_each_sides_levels_and_program(open_page):
    at = open_page("pages/pairs.py")
    assert at.selectbox(key=state.PAIRS_OPEN).value == (1, 0)  # current "uses aux" beat comparator "identity"
    winner = _inside(at, state.pair_breakdown_key("winner"), "markdown")
    loser = _inside(at, state.pair_breakdown_key("loser"), "markdown")
    assert [m.value for m in winner] == [f"**Winner** · {USES_SUMMARY}"]
    assert [m.value for m in loser] == [f"**Loser** · {IDENTITY_SUMMARY}"]
    assert [c.value for c in _inside(at, state.pair_breakdown_key("winner"), "caption")] == [
        f"level reward {USES_REWARD:.4g}"
    ]
    assert [c.value for c in _inside(at, state.pair_breakdown_key("loser"), "caption")] == [
        f"level reward {IDENTITY_REWARD:.4g}"
    ]
    programs = _inside(at, state.pair_breakdown_key("winner"), "code")
    assert len(programs) == 1 and programs[0].language == "python"
    assert MAIN_USES.strip() in programs[0].value and programs[0].value.index("def aux(") < programs[0].value.index(
        "def sort_third("
    )
    assert _inside(at, state.pair_breakdown_key("loser"), "code")[0].value.endswith(MAIN_IDENTITY.strip())
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["winner reward"] == f"{USES_REWARD - 4:.4g}"  # the processed reward: shift -4
    candidates = at.dataframe[1].value
    assert candidates["why"].tolist() == [USES_SUMMARY, IDENTITY_SUMMARY, IDENTITY_SUMMARY, USES_SUMMARY]

    # The other pair: the comparator's "uses aux" won.
    at.selectbox(key=state.PAIRS_OPEN).select((1, 1)).run()
    assert [m.value for m in _inside(at, state.pair_breakdown_key("winner"), "markdown")] == [
        f"**Winner** · {USES_SUMMARY}"
    ]
    assert [m.value for m in _inside(at, state.pair_breakdown_key("loser"), "markdown")] == [
        f"**Loser** · {IDENTITY_SUMMARY}"
    ]
