"""The Setup form as a new user meets it: a fast first render, fields that never trap, every error at once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from comlrl_lab.engine.presets import QUICKSTART_TRAIN_ITEMS
from comlrl_lab.ui import forms, services, state

ROOT = Path(__file__).resolve().parents[1]

FIRST_RENDER = """
import os, sys, tempfile
os.environ["COMLRL_LAB_RUNS_DIR"] = tempfile.mkdtemp()
from streamlit.testing.v1 import AppTest
at = AppTest.from_file(sys.argv[1], default_timeout=120).run()
assert not at.exception, [e.value for e in at.exception]
assert at.title[0].value == "Set up an experiment"
print(sorted(m for m in ("torch", "transformers", "peft") if m in sys.modules))
"""


def test_the_first_render_of_setup_imports_neither_torch_nor_transformers():
    # torch alone takes about 2 s to import: the page a new user opens first must not wait for it.
    result = subprocess.run(
        [sys.executable, "-c", FIRST_RENDER, str(ROOT / "app.py")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


# -- AppTest of the form --------------------------------------------------------------------------------------


@pytest.fixture
def setup_page(tmp_path, monkeypatch):
    """The app on Setup (MADPOIter) with an empty runs folder."""
    monkeypatch.setenv(services.RUNS_DIR_ENV, str(tmp_path))
    services.close_all()
    st.cache_resource.clear()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.session_state[state.SETUP_PRESET] = (
        forms.PRESET_NONE
    )  # start from CoMLRL's defaults; the preset has its own test
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    yield at
    services.close_all()
    st.cache_resource.clear()


def _key(name: str) -> str:
    return state.config_field_key("MADPOIter", name)


def _spec(at: AppTest) -> dict:
    return json.loads(at.get("json")[0].proto.body)


def _valid(at: AppTest) -> bool:
    return (
        any("MADPOIterConfig is valid" in s.value for s in at.success)
        and not at.button(key=state.SETUP_CREATE).disabled
    )


def test_a_replay_field_left_from_another_mode_is_hidden_and_never_blocks_creation(setup_page):
    at = setup_page
    at.selectbox(key=_key("preference_replay_mode")).select("nearest_k").run()
    at.number_input(key=_key("preference_replay_k")).set_value(3).run()
    at.number_input(key=_key("preference_replay_sample_size")).set_value(40).run()
    assert _valid(at) and _spec(at)["config"]["preference_replay_k"] == 3

    # CoMLRL refuses k and a sample size under 'current'; the form drops them instead of trapping the user.
    at.selectbox(key=_key("preference_replay_mode")).select("current").run()
    assert not at.error and _valid(at)
    config = _spec(at)["config"]
    assert "preference_replay_k" not in config and "preference_replay_sample_size" not in config
    drawn = [w.key for w in at.number_input]
    assert _key("preference_replay_k") not in drawn and _key("preference_replay_sample_size") not in drawn

    # Back on nearest_k the values the user typed are still there.
    at.selectbox(key=_key("preference_replay_mode")).select("nearest_k").run()
    assert at.number_input(key=_key("preference_replay_sample_size")).value == 40
    assert _valid(at)


def test_choosing_lambda_decay_fills_in_half_and_says_so(setup_page):
    at = setup_page
    at.selectbox(key=_key("preference_replay_mode")).select("lambda_decay").run()
    assert at.number_input(key=_key("preference_replay_lambda")).value == 0.5
    assert not at.error and _valid(at)
    assert any("Filled in 0.5" in c.value for c in at.caption)
    at.number_input(key=_key("preference_replay_lambda")).set_value(0.8).run()
    assert not any("Filled in" in c.value for c in at.caption)


def test_every_validation_error_shows_at_once(setup_page):
    at = setup_page
    at.selectbox(key=_key("preference_replay_mode")).select("lambda_decay").run()
    at.number_input(key=_key("preference_replay_lambda")).set_value(1.5).run()
    at.number_input(key=_key("comparator_num_candidates")).set_value(0).run()
    shown = " ".join(e.value for e in at.error)
    assert "preference_replay_lambda must be in [0, 1]." in shown
    assert "comparator_num_candidates must be >= 1 or null." in shown
    assert at.button(key=state.SETUP_CREATE).disabled


def test_an_optional_number_field_can_be_emptied_back_to_none(setup_page):
    at = setup_page
    top_k = at.number_input(key=_key("top_k"))
    assert top_k.value == 50
    # Streamlit lets the box be emptied only when the widget has no number as its default.
    assert not top_k.proto.HasField("default")
    at.number_input(key=_key("top_k")).set_value(7).run()
    at.number_input(key=_key("top_k")).set_value(None).run()
    assert at.number_input(key=_key("top_k")).value is None
    assert not at.number_input(key=_key("top_k")).proto.HasField("default")
    assert _spec(at)["config"]["top_k"] is None and _valid(at)


def test_an_empty_comparator_history_k_says_what_none_means(setup_page):
    at = setup_page
    at.selectbox(key=_key("comparator_policy")).select("history").run()
    assert at.number_input(key=_key("comparator_history_k")).placeholder == "None = 1 round back"


def test_more_agents_than_the_task_has_prompts_for_is_refused_in_the_form(setup_page):
    at = setup_page
    at.number_input(key=state.SETUP_NUM_AGENTS).set_value(3).run()
    assert any("has prompts for 2 agents, the Agents section has 3" in w.value for w in at.warning)
    assert at.button(key=state.SETUP_CREATE).disabled
    at.number_input(key=state.SETUP_NUM_AGENTS).set_value(2).run()
    assert _valid(at)


def test_a_reload_brings_the_setup_draft_back_from_the_url(tmp_path, monkeypatch):
    # The browser writes every Setup value that differs from its default into the URL (bound widgets); a reload
    # sends that URL back. An empty value is an emptied optional field.
    monkeypatch.setenv(services.RUNS_DIR_ENV, str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.query_params = {
        _key("preference_replay_mode"): "nearest_k",
        _key("preference_replay_sample_size"): "40",
        _key("top_k"): "",
        state.SETUP_RUN_NAME: "draft",
    }
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key=_key("preference_replay_mode")).value == "nearest_k"
    assert at.number_input(key=_key("preference_replay_sample_size")).value == 40
    assert at.number_input(key=_key("top_k")).value is None
    assert at.text_input(key=state.SETUP_RUN_NAME).value == "draft"
    assert _valid(at)


def test_a_draft_goes_into_the_url_and_a_new_session_rebuilds_it(tmp_path, monkeypatch):
    # A session starts from the quickstart preset; the page writes what differs from it into the URL after every
    # run (a number, a select, a toggle turned off, an emptied box whose preset is a number, a replay mode with
    # its k), and a new session given that URL (a reload) draws the same form on its first run.
    monkeypatch.setenv(services.RUNS_DIR_ENV, str(tmp_path))
    services.close_all()
    st.cache_resource.clear()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    assert at.toggle(key=_key("madpo_length_normalize")).value is True  # the preset's
    assert not any(k.startswith(("cfg.", "setup.")) for k in at.query_params)  # nothing differs yet
    at.number_input(key=_key("num_iterations")).set_value(3).run()
    at.selectbox(key=state.SETUP_TASK).select("topic_relay").run()
    at.toggle(key=_key("madpo_length_normalize")).set_value(False).run()
    at.number_input(key=state.SETUP_MAX_EVAL_ITEMS).set_value(None).run()
    at.selectbox(key=_key("preference_replay_mode")).select("nearest_k").run()
    at.number_input(key=_key("preference_replay_k")).set_value(3).run()
    url = {k: v for k, v in at.query_params.items() if k.startswith(("cfg.", "setup."))}
    assert url == {
        _key("num_iterations"): "3",
        state.SETUP_TASK: "topic_relay",
        _key("madpo_length_normalize"): "false",
        state.SETUP_MAX_EVAL_ITEMS: "",
        _key("preference_replay_mode"): "nearest_k",
        _key("preference_replay_k"): "3",
    }
    drafted = _spec(at)

    reloaded = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    reloaded.query_params = dict(url)
    reloaded.run()
    assert not reloaded.exception, [e.value for e in reloaded.exception]
    assert reloaded.number_input(key=_key("num_iterations")).value == 3
    assert reloaded.selectbox(key=state.SETUP_TASK).value == "topic_relay"
    assert reloaded.toggle(key=_key("madpo_length_normalize")).value is False
    assert reloaded.number_input(key=state.SETUP_MAX_EVAL_ITEMS).value is None
    assert reloaded.number_input(key=state.SETUP_MAX_TRAIN_ITEMS).value == QUICKSTART_TRAIN_ITEMS  # untouched
    assert reloaded.number_input(key=_key("preference_replay_k")).value == 3  # not the 2 the form fills in
    assert _spec(reloaded) == drafted and _valid(reloaded)
    assert any("came back from the page's address" in i.value for i in reloaded.info)

    # Back to the preset's value: the key leaves the URL.
    reloaded.number_input(key=_key("num_iterations")).set_value(5).run()
    assert _key("num_iterations") not in reloaded.query_params
    services.close_all()
    st.cache_resource.clear()


def test_a_value_in_the_url_the_form_cannot_hold_is_skipped_and_said(tmp_path, monkeypatch):
    monkeypatch.setenv(services.RUNS_DIR_ENV, str(tmp_path))
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.query_params = {_key("preference_replay_mode"): "sometimes", _key("num_iterations"): "3"}
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key=_key("preference_replay_mode")).value == "lambda_decay"
    assert at.number_input(key=_key("num_iterations")).value == 3
    skipped = "='sometimes': preference_replay_mode must be one of: current, nearest_k, all_history, lambda_decay."
    assert any(skipped in i.value for i in at.info)
    assert _key("preference_replay_mode") not in at.query_params


# -- the run list ---------------------------------------------------------------------------------------------


def _make_runs(root: Path) -> dict[str, str]:
    ws = services.workspace()
    return {
        "alpha": ws.create_run(services.ExperimentSpec(name="alpha", config={"num_iterations": 2})),
        "beta": ws.create_run(services.ExperimentSpec(name="beta")),
        "single": ws.create_run(services.ExperimentSpec(algorithm="MADPO", name="single")),
    }


def test_the_run_list_filters_sorts_archives_and_deletes_with_a_confirmation(setup_page, tmp_path):
    runs = _make_runs(tmp_path)
    at = setup_page
    at.run()
    table = at.dataframe[0].value
    assert list(table["run_id"]) == [runs["single"], runs["beta"], runs["alpha"]]  # newest first

    at.multiselect(key=state.RUNS_ALGORITHM).select("MADPOIter").run()
    assert set(at.dataframe[0].value["run_id"]) == {runs["alpha"], runs["beta"]}
    at.text_input(key=state.RUNS_TEXT).input("alph").run()
    assert list(at.dataframe[0].value["run_id"]) == [runs["alpha"]]
    at.text_input(key=state.RUNS_TEXT).input("").run()
    at.selectbox(key=state.RUNS_SORT).select("oldest first").run()
    assert list(at.dataframe[0].value["run_id"]) == [runs["alpha"], runs["beta"]]

    # Nothing is removed without the confirmation box.
    at.selectbox(key=state.RUNS_PICK).select(runs["alpha"]).run()
    assert at.button(key=state.RUNS_ARCHIVE).disabled and at.button(key=state.RUNS_DELETE).disabled
    at.checkbox(key=state.RUNS_CONFIRM).check().run()
    at.button(key=state.RUNS_ARCHIVE).click().run()
    assert not (tmp_path / runs["alpha"]).exists() and (tmp_path / "_archive" / runs["alpha"] / "spec.json").is_file()
    assert any(f"Archived {runs['alpha']}" in s.value for s in at.success)
    assert runs["alpha"] not in set(at.dataframe[0].value["run_id"])

    at.selectbox(key=state.RUNS_PICK).select(runs["beta"]).run()
    assert at.checkbox(key=state.RUNS_CONFIRM).value is False  # the confirmation does not carry over
    at.checkbox(key=state.RUNS_CONFIRM).check().run()
    at.button(key=state.RUNS_DELETE).click().run()
    assert not (tmp_path / runs["beta"]).exists()
    assert any(f"Deleted {runs['beta']}" in s.value for s in at.success)


def test_the_run_list_tag_filter_matches_the_runs_tags_as_the_compare_page_does(setup_page, tmp_path):
    from comlrl_lab.ui import compare, frames

    ws = services.workspace()
    runs = {
        "a1": ws.create_run(services.ExperimentSpec(name="a1", tags=["sweep-a", "baseline"])),
        "a2": ws.create_run(services.ExperimentSpec(name="a2", tags=["sweep-a"])),
        "b1": ws.create_run(services.ExperimentSpec(name="b1", tags=["sweep-b"])),
        # Its id names a tag it does not carry: a filter on run-id text would show it.
        "untagged": ws.create_run(services.ExperimentSpec(name="sweep-a-lookalike")),
    }
    at = setup_page
    at.run()
    assert at.multiselect(key=state.RUNS_TAGS).options == ["baseline", "sweep-a", "sweep-b"]
    at.multiselect(key=state.RUNS_TAGS).select("sweep-a").run()
    assert set(at.dataframe[0].value["run_id"]) == {runs["a1"], runs["a2"]}
    at.multiselect(key=state.RUNS_TAGS).select("sweep-b").run()  # any of the chosen tags
    assert set(at.dataframe[0].value["run_id"]) == {runs["a1"], runs["a2"], runs["b1"]}
    at.multiselect(key=state.RUNS_TAGS).unselect("sweep-a").unselect("sweep-b").select("baseline").run()
    assert list(at.dataframe[0].value["run_id"]) == [runs["a1"]]
    assert at.dataframe[0].value["tags"].tolist() == ["sweep-a, baseline"]

    # The Compare page's filter gives the same runs for the same tags.
    for tags in (["sweep-a"], ["sweep-a", "sweep-b"], ["baseline"], []):
        listed = frames.filter_runs(services.run_list(), tags=tags)
        compared = compare.filter_runs(compare.catalogue(tmp_path), tags=tags)
        assert set(listed["run_id"]) == {e.run_id for e in compared}, tags


def test_an_active_run_cannot_be_archived_or_deleted(setup_page, tmp_path):
    from dataclasses import replace

    runs = _make_runs(tmp_path)
    ws = services.workspace()
    ws.view(runs["beta"])  # open it, as the Rounds page does
    ws.manager._progress[runs["beta"]] = replace(ws.manager.progress(runs["beta"]), status="running")
    with pytest.raises(RuntimeError, match="running: pause or stop it first"):
        ws.remove_run(runs["beta"], archive=False)
    assert (tmp_path / runs["beta"] / "spec.json").is_file()

    at = setup_page
    at.run()
    at.selectbox(key=state.RUNS_PICK).select(runs["beta"]).run()
    assert at.checkbox(key=state.RUNS_CONFIRM).disabled
    assert at.button(key=state.RUNS_DELETE).disabled and at.button(key=state.RUNS_ARCHIVE).disabled
    assert any("is running: pause or stop it" in c.value for c in at.caption)
    ws.manager._progress[runs["beta"]] = replace(ws.manager.progress(runs["beta"]), status="idle")


def test_create_moves_on_to_rounds_while_the_draft_is_in_the_url(tmp_path, monkeypatch):
    # Streamlit refuses to clear a query that widgets are bound to, which a plain st.switch_page does.
    monkeypatch.setenv(services.RUNS_DIR_ENV, str(tmp_path))
    services.close_all()
    st.cache_resource.clear()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60)
    at.query_params = {_key("num_iterations"): "2"}
    at.run()
    at.button(key=state.SETUP_CREATE).click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Rounds"
    assert at.query_params[state.URL_RUN] == at.session_state[state.RUN_ID]
    services.close_all()
    st.cache_resource.clear()


def test_a_new_session_starts_from_the_quickstart_preset(tmp_path, monkeypatch):
    from comlrl_lab.engine.presets import QUICKSTART_CONFIG

    monkeypatch.setenv(services.RUNS_DIR_ENV, str(tmp_path))
    services.close_all()
    st.cache_resource.clear()
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("quickstart preset" in i.value for i in at.info)
    for name in ("num_iterations", "agent_learning_rate", "madpo_nll_weight", "madpo_reference", "pair_selection"):
        assert at.session_state[state.config_field_key("MADPOIter", name)] == QUICKSTART_CONFIG[name], name
    assert at.session_state[state.SETUP_MAX_TRAIN_ITEMS] == QUICKSTART_TRAIN_ITEMS == 32
    at.run()  # the preset is applied once: a value changed afterwards stays
    assert not any("quickstart preset" in i.value for i in at.info)
    services.close_all()
    st.cache_resource.clear()


@pytest.mark.parametrize(
    ("widget", "bad", "line"),
    [
        (state.SETUP_MAX_TRAIN_ITEMS, 0, "max_train_items must be an integer >= 1 or null, got 0."),
        (state.SETUP_MAX_EVAL_ITEMS, -3, "max_eval_items must be an integer >= 1 or null, got -3."),
        (state.SETUP_NUM_AGENTS, 0, "num_agents must be >= 1."),
    ],
)
def test_an_out_of_range_number_disables_create_with_one_line(setup_page, widget, bad, line):
    # The browser drops a value outside a number box's min_value/max_value with only a red outline, and the run
    # differed from the form: no box on Setup has such bounds; the spec and the config refuse, as for λ 1.5.
    at = setup_page
    bounded = [w.key for w in at.number_input if w.proto.has_min or w.proto.has_max]
    assert bounded == []
    at.number_input(key=widget).set_value(bad).run()
    assert not at.exception, [e.value for e in at.exception]
    lines = [e.value for e in at.error if line in e.value]
    assert len(lines) == 1, [e.value for e in at.error]
    assert at.button(key=state.SETUP_CREATE).disabled
    assert not any("is valid" in s.value for s in at.success)
    at.number_input(key=widget).set_value(2).run()
    assert _valid(at)
