"""The workbench on a humaneval run: why a pair won (each side's level summary and program on the Pairs page), and
the evaluation a coder reports (pass@1 and the mean level reward with their 95% CIs) on the Learning and Compare
pages.

The run is made without a model (``code_fixtures``): known completions scored by the real reward in the sandbox.
"""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io
import pytest
from code_fixtures import (
    EVAL_LEVELS,
    IDENTITY_REWARD,
    IDENTITY_SUMMARY,
    MAIN_IDENTITY,
    MAIN_USES,
    USES_REWARD,
    USES_SUMMARY,
    seed_code_run,
)
from streamlit.testing.v1 import AppTest
from workbench_fixtures import fresh_app_caches

from comlrl_lab.data.confidence import wilson_interval
from comlrl_lab.ui import forms, frames, services, state

APP = str(Path(__file__).resolve().parents[1] / "app.py")
TIMEOUT = 60


@pytest.fixture(scope="module")
def code_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return root, seed_code_run(root)


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

    fresh_app_caches()
    yield make
    fresh_app_caches()


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


def _figures(at: AppTest) -> list[go.Figure]:
    return [plotly.io.from_json(chart.proto.spec) for chart in at.get("plotly_chart")]


def _array(values) -> list:
    """A plotly array as a list (plotly writes numpy data as base64 typed arrays)."""
    if isinstance(values, dict) and "bdata" in values:
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=np.dtype(values["dtype"])).tolist()
    return list(values)


def test_learning_shows_pass_at_1_and_the_level_reward_with_their_intervals(open_page):
    at = open_page("pages/learning.py")
    tiles = {m.label: m.value for m in at.metric}
    assert tiles["eval pass@1"] == "50.0%"  # HumanEval/0 passes, /1 does not
    figures = {f.layout.title.text: f for f in _figures(at)}
    line, band = figures["Evaluation: pass@1 per round"].data
    assert _array(line.y) == [0.5] and band.name == "pass@1: 95% CI"
    assert sorted(_array(band.y)) == pytest.approx(sorted(wilson_interval(1, 2)))  # (0.0945, 0.9055)
    line, band = figures["Evaluation: mean level reward per round"].data
    mean = sum(EVAL_LEVELS) / 2
    assert _array(line.y) == [pytest.approx(mean)]
    # n = 2, s = 2.828: mean ± t(0.975, 1) * s / sqrt(2) = 2 ± 12.706 * 2
    assert sorted(_array(band.y)) == pytest.approx([mean - 12.706 * 2.0, mean + 12.706 * 2.0])
    # Two programs make a wide t interval; the axis stays on the level reward's own range, 0 to 4.
    assert figures["Evaluation: mean level reward per round"].layout.yaxis.range == pytest.approx((-0.12, 4.12))


def test_compare_draws_the_code_evaluation_curves(open_page, code_run):
    at = open_page("pages/compare.py")
    assert at.multiselect(key=state.COMPARE_RUNS).value == [code_run[1]]
    curves = next(f for f in _figures(at) if f.layout.annotations)
    titles = [a.text for a in curves.layout.annotations]
    assert {"Evaluation pass@1", "Evaluation level reward", "Evaluation reward"} <= set(titles)
    panel = {title: i for i, title in enumerate(titles)}
    means = {t.yaxis: _array(t.y) for t in curves.data if t.mode == "lines+markers"}

    def axis(title: str) -> str:
        return "y" if panel[title] == 0 else f"y{panel[title] + 1}"

    assert means[axis("Evaluation pass@1")] == [0.5]  # one run: its own value, the band has no width
    assert means[axis("Evaluation level reward")] == [pytest.approx(sum(EVAL_LEVELS) / 2)]
