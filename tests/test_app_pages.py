"""AppTest of every workbench page against one seeded two-round run (MADPOIter, history comparator, lambda_decay).

The run is made once per module by driving the engine directly; each test opens the app with that run selected
and asserts what the page shows against the store. ``st.cache_resource`` (the workspace) is cleared around each
test, and the runs folder comes from ``COMLRL_LAB_RUNS_DIR``.
"""

from __future__ import annotations

import html
import io
import json
import re
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
from streamlit.testing.v1 import AppTest
from workbench_fixtures import agent_model, fresh_app_caches, seed_run

from comlrl_lab.store import schema
from comlrl_lab.trainers.preference import MADPOIterConfig
from comlrl_lab.trainers.preference.config import CONFIG_CLASSES, fields
from comlrl_lab.trainers.preference.rounds.replay import lambda_decay_weights
from comlrl_lab.ui import forms, model_picker, services, state, words

APP = str(Path(__file__).resolve().parents[1] / "app.py")
TIMEOUT = 90


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    model = agent_model(tmp_path_factory.mktemp("model"))
    run_id = seed_run(root, model)
    return SimpleNamespace(root=root, run_id=run_id, model=model)


class RecordingStorage(MemoryMediaFileStorage):
    """Keeps the bytes of every file a page hands to the browser (download buttons), by file name."""

    files: dict[str, bytes] = {}

    def load_and_get_id(self, path_or_data, mimetype, kind, filename=None):
        data = path_or_data if isinstance(path_or_data, bytes) else Path(path_or_data).read_bytes()
        RecordingStorage.files[filename or ""] = data
        return super().load_and_get_id(path_or_data, mimetype, kind, filename)


@pytest.fixture
def downloads(monkeypatch):
    RecordingStorage.files = {}
    monkeypatch.setattr("streamlit.testing.v1.app_test.MemoryMediaFileStorage", RecordingStorage)
    return RecordingStorage.files


@pytest.fixture
def open_app(seeded, monkeypatch):
    """``open_app(page, root=..., run_id=...)``: the app on ``page`` with a run selected, run once, no exception."""

    def make(page: str | None = None, *, root: Path | None = None, run_id: str | None = "seeded") -> AppTest:
        monkeypatch.setenv(services.RUNS_DIR_ENV, str(root or seeded.root))
        at = AppTest.from_file(APP, default_timeout=TIMEOUT)
        # The form at CoMLRL's defaults (test_setup_form covers the preset).
        at.session_state[state.SETUP_PRESET] = forms.PRESET_NONE
        if run_id is not None:
            at.session_state[state.RUN_ID] = seeded.run_id if run_id == "seeded" else run_id
        at.run()
        if page is not None:
            at.switch_page(page).run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    fresh_app_caches()
    yield make
    fresh_app_caches()


def _store(seeded):
    return services.workspace().view(seeded.run_id).store


def _container_holding(at: AppTest, key: str):
    """The block whose direct children include the element with ``key`` (a column, a container)."""

    def walk(node):
        for child in getattr(node, "children", {}).values():
            if getattr(child, "key", None) == key:
                return node
            found = walk(child)
            if found is not None:
                return found
        return None

    return walk(at._tree)


def _texts(node, kind: str) -> list[str]:
    out = []
    for child in getattr(node, "children", {}).values():
        if getattr(child, "type", None) == kind:
            out.append(child.value)
        out.extend(_texts(child, kind))
    return out


def _plotly(at: AppTest) -> list[dict]:
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def _array(values) -> list:
    """A plotly JSON array as a list (plotly writes numpy data as base64 typed arrays)."""
    if isinstance(values, dict) and "bdata" in values:
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=np.dtype(values["dtype"])).tolist()
    return list(values)


def _strip(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


# -- Setup --------------------------------------------------------------------------------------------------


def test_setup_shows_every_field_with_its_help_and_the_api_message_next_to_the_field(open_app):
    at = open_app(run_id=None)
    assert at.title[0].value == "Set up an experiment"
    assert at.number_input(key=state.SETUP_NUM_AGENTS).value == 2
    assert any("MADPOIterConfig is valid" in s.value for s in at.success)

    # Every config field of every algorithm has a widget, labelled with its CoMLRL name, help text as tooltip.
    for family, iterative in (("MADPO", True), ("MADPO", False), ("MARLHF", True), ("MARLHF", False)):
        at.segmented_control(key=state.SETUP_FAMILY).set_value(family)
        at.toggle(key=state.SETUP_ITERATIVE).set_value(iterative).run()
        algorithm = f"{family}{'Iter' if iterative else ''}"
        specs = forms.field_specs(CONFIG_CLASSES[algorithm])
        defaults = {name: spec.default for name, spec in specs.items()}
        for name, help_text in CONFIG_CLASSES[algorithm].field_help().items():
            if name in forms.HIDDEN_FIELDS or not fields.applies(specs, name, defaults):
                continue  # fields of other modes are drawn once their mode is chosen (tests/test_setup_form.py)
            widget = at.get_by_key(state.config_field_key(algorithm, name))
            assert widget.label == name
            assert help_text in widget.help and "Default" in widget.help
    at.segmented_control(key=state.SETUP_FAMILY).set_value("MADPO")
    at.toggle(key=state.SETUP_ITERATIVE).set_value(True).run()

    # An invalid combination: the exact ValueError of the Python API, in the λ field's own column.
    with pytest.raises(ValueError) as raised:
        MADPOIterConfig(preference_replay_mode="lambda_decay")
    at.selectbox(key=state.config_field_key("MADPOIter", "preference_replay_mode")).select("lambda_decay").run()
    lam_key = state.config_field_key("MADPOIter", "preference_replay_lambda")
    assert at.number_input(key=lam_key).value == 0.5  # filled in on the switch, see tests/test_setup_form.py
    at.number_input(key=lam_key).set_value(None).run()
    assert str(raised.value) in _texts(_container_holding(at, lam_key), "error")
    assert any("field `preference_replay_lambda`" in e.value for e in at.error)
    assert at.button(key=state.SETUP_CREATE).disabled

    at.number_input(key=lam_key).set_value(0.5).run()
    assert not at.error
    assert any("MADPOIterConfig is valid" in s.value for s in at.success)
    preview = _plotly(at)[-1]
    assert [round(y, 6) for y in _array(preview["data"][0]["y"])] == [round(w, 6) for w in lambda_decay_weights(6, 0.5)]

    # A comparator field: history k is drawn for a history comparator only, and never blocks another policy.
    at.selectbox(key=state.config_field_key("MADPOIter", "comparator_policy")).select("history").run()
    history_key = state.config_field_key("MADPOIter", "comparator_history_k")
    at.number_input(key=history_key).set_value(0).run()
    assert "comparator_history_k must be >= 1." in _texts(_container_holding(at, history_key), "error")
    at.selectbox(key=state.config_field_key("MADPOIter", "comparator_policy")).select("current").run()
    assert not at.error and history_key not in [w.key for w in at.number_input]
    assert any("MADPOIterConfig is valid" in s.value for s in at.success)

    # The spec that "Save config" downloads carries the form's values and never an API key field.
    spec = json.loads(at.get("json")[0].proto.body)
    assert spec["algorithm"] == "MADPOIter" and spec["config"]["preference_replay_lambda"] == 0.5
    assert "comparator_api_key" not in spec["config"]


def test_setup_copies_a_past_runs_setup_into_the_form(open_app, seeded):
    at = open_app(run_id=None)
    at.selectbox(key=state.SETUP_PAST).select(str(seeded.root / seeded.run_id))
    at.button(key=state.SETUP_COPY_PAST).click().run()
    assert any("Loaded the setup" in s.value for s in at.success)
    assert at.selectbox(key=state.config_field_key("MADPOIter", "comparator_policy")).value == "history"
    assert at.selectbox(key=state.config_field_key("MADPOIter", "preference_replay_mode")).value == "lambda_decay"
    assert at.number_input(key=state.config_field_key("MADPOIter", "preference_replay_lambda")).value == 0.5
    assert at.number_input(key=state.config_field_key("MADPOIter", "num_iterations")).value == 2
    assert at.number_input(key=state.SETUP_MAX_TRAIN_ITEMS).value == 8


def test_setup_saves_a_config_file_and_loads_it_back(open_app, downloads):
    at = open_app(run_id=None)
    at.selectbox(key=state.config_field_key("MADPOIter", "comparator_policy")).select("history")
    at.selectbox(key=state.config_field_key("MADPOIter", "preference_replay_mode")).select("nearest_k").run()
    at.number_input(key=state.config_field_key("MADPOIter", "preference_replay_k")).set_value(3)
    at.number_input(key=state.config_field_key("MADPOIter", "dpo_beta")).set_value(0.25)
    at.multiselect(key=state.config_field_key("MADPOIter", "report_to")).set_value(["tensorboard"])
    at.text_input(key=state.SETUP_RUN_NAME).input("roundtrip").run()
    saved = downloads["roundtrip.spec.json"]
    spec = json.loads(saved)
    assert spec["config"] == {
        "comparator_policy": "history",
        "preference_replay_mode": "nearest_k",
        "preference_replay_k": 3,
        "dpo_beta": 0.25,
        "report_to": ["tensorboard"],
    }

    fresh = open_app(run_id=None)
    assert fresh.selectbox(key=state.config_field_key("MADPOIter", "preference_replay_mode")).value == "current"
    fresh.get_by_key(state.SETUP_LOAD_FILE).set_value(("roundtrip.spec.json", saved, "application/json"))
    fresh.button(key=state.SETUP_APPLY_FILE).click().run()
    assert any("Loaded roundtrip.spec.json" in s.value for s in fresh.success)
    assert fresh.selectbox(key=state.config_field_key("MADPOIter", "preference_replay_mode")).value == "nearest_k"
    assert fresh.number_input(key=state.config_field_key("MADPOIter", "preference_replay_k")).value == 3
    assert fresh.number_input(key=state.config_field_key("MADPOIter", "dpo_beta")).value == 0.25
    assert fresh.multiselect(key=state.config_field_key("MADPOIter", "report_to")).value == ["tensorboard"]
    assert fresh.text_input(key=state.SETUP_RUN_NAME).value == "roundtrip"


def test_setup_reads_a_file_as_the_cli_does_and_a_mistake_loads_nothing(open_app, tmp_path, capsys):
    from comlrl_lab import cli

    text = "algorithm: MADPOIter\nconfig:\n  num_iterations: 2\n  dpo_bta: 0.5\n"
    expected = "spec.yaml:4: config: MADPOIterConfig has no field 'dpo_bta'; did you mean 'dpo_beta'?"
    (tmp_path / "spec.yaml").write_text(text)
    assert cli.main(["run", str(tmp_path / "spec.yaml"), "--runs-root", str(tmp_path / "runs")]) == 2
    where = str(tmp_path / "spec.yaml")  # the CLI names the path it was given; the app the upload's name
    assert capsys.readouterr().err.strip() == f"comlrl-lab run: {where}{expected.removeprefix('spec.yaml')}"

    at = open_app(run_id=None)
    at.get_by_key(state.SETUP_LOAD_FILE).set_value(("spec.yaml", text.encode(), "application/x-yaml"))
    at.button(key=state.SETUP_APPLY_FILE).click().run()
    assert [e.value for e in at.error if "Nothing was loaded" in e.value] == [f"Nothing was loaded: {expected}"]
    assert at.number_input(key=state.config_field_key("MADPOIter", "num_iterations")).value == 6  # untouched

    # A bare config (CoMLRL field names alone) is read for the algorithm chosen now, strings by the field codec.
    bare = b"num_iterations: 2\nagent_learning_rate: 1e-3\npreference_replay_mode: lambda\npreference_replay_lambda: 0.25\n"
    at.get_by_key(state.SETUP_LOAD_FILE).set_value(("bare.yaml", bare, "application/x-yaml"))
    at.button(key=state.SETUP_APPLY_FILE).click().run()
    assert any("Loaded bare.yaml" in s.value for s in at.success)
    assert at.number_input(key=state.config_field_key("MADPOIter", "agent_learning_rate")).value == 0.001
    assert at.selectbox(key=state.config_field_key("MADPOIter", "preference_replay_mode")).value == "lambda_decay"
    assert at.number_input(key=state.config_field_key("MADPOIter", "preference_replay_lambda")).value == 0.25


SPEC_REFUSALS = {
    # The app used to keep the replay mode and fill in k = 2 where the CLI refused.
    "nearest_k without its k": (
        "algorithm: MADPOIter\nconfig:\n  num_iterations: 2\n  preference_replay_mode: nearest_k\n",
        "spec.yaml:2: preference_replay_k is required when preference_replay_mode='nearest_k'.",
    ),
    # The app used to show yaml's ScannerError as it was raised.
    "broken YAML": (
        "algorithm: MADPOIter\nconfig:\n  num_iterations: 2\n   bad: [\n",
        "spec.yaml:4:7: YAML syntax error: mapping values are not allowed here",
    ),
    # Both used to name no line and suggest nothing.
    "an unknown task": (
        "algorithm: MADPOIter\ntask: lenght_ratio\nconfig:\n  num_iterations: 2\n",
        "spec.yaml:2: unknown task 'lenght_ratio'; did you mean 'length_ratio'? (built-in tasks: length_ratio, "
        "topic_relay, stance_agreement, humaneval; a task of your own goes in user_task)",
    ),
}


@pytest.mark.parametrize("mistake", list(SPEC_REFUSALS))
def test_setup_and_the_cli_refuse_a_spec_with_the_same_line_and_load_nothing(open_app, tmp_path, capsys, mistake):
    from comlrl_lab import cli

    text, expected = SPEC_REFUSALS[mistake]
    (tmp_path / "spec.yaml").write_text(text)
    assert cli.main(["run", str(tmp_path / "spec.yaml"), "--runs-root", str(tmp_path / "runs")]) == 2
    where = str(tmp_path / "spec.yaml")
    assert capsys.readouterr().err.strip() == f"comlrl-lab run: {where}{expected.removeprefix('spec.yaml')}"

    at = open_app(run_id=None)
    mode = at.selectbox(key=state.config_field_key("MADPOIter", "preference_replay_mode")).value
    at.get_by_key(state.SETUP_LOAD_FILE).set_value(("spec.yaml", text.encode(), "application/x-yaml"))
    at.button(key=state.SETUP_APPLY_FILE).click().run()
    assert [e.value for e in at.error if "Nothing was loaded" in e.value] == [f"Nothing was loaded: {expected}"]
    assert at.number_input(key=state.config_field_key("MADPOIter", "num_iterations")).value == 6  # untouched
    assert at.selectbox(key=state.config_field_key("MADPOIter", "preference_replay_mode")).value == mode
    k_box = state.config_field_key("MADPOIter", "preference_replay_k")
    assert mode != "nearest_k" and not [box for box in at.number_input if box.key == k_box]  # no k was set


def test_setup_takes_a_user_task_module_and_checks_it(open_app):
    repo = Path(APP).parent
    at = open_app(run_id=None)
    at.segmented_control(key=state.SETUP_TASK_KIND).set_value("Your own task module").run()
    assert at.button(key=state.SETUP_CREATE).disabled  # no module yet
    at.text_input(key=state.SETUP_USER_MODULE).input(str(repo / "examples/custom_task/my_task.py")).run()
    at.button(key=state.SETUP_CHECK_TASK).click().run()
    assert any("Topic and praise" in s.value and "12 training items" in s.value for s in at.success)
    assert not at.button(key=state.SETUP_CREATE).disabled
    spec = json.loads(at.get("json")[0].proto.body)
    assert spec["task"] is None and spec["user_task"].endswith("my_task.py")

    at.text_input(key=state.SETUP_USER_MODULE).input(str(repo / "examples/custom_task/missing.py")).run()
    at.button(key=state.SETUP_CHECK_TASK).click().run()
    assert any("The task cannot be loaded" in e.value and "missing.py" in e.value for e in at.error)


# -- Rounds -------------------------------------------------------------------------------------------------


def test_rounds_shows_the_finished_runs_phase_timeline(open_app, seeded):
    at = open_app("pages/rounds.py")
    assert at.title[0].value == "Rounds"
    metrics = {m.label: m.value for m in at.metric}
    rounds = _store(seeded).rounds(seeded.run_id)
    assert metrics["round"] == "2 / 2"
    assert metrics["next phase"] == "done"
    assert metrics["pairs collected"] == str(int(rounds["num_pairs"].sum()))
    table = at.dataframe[0].value
    assert list(table["round"]) == [1, 2]
    for column in ("Collect", "Select replay sample", "Train", "Evaluate"):
        assert all(cell.startswith("✓") for cell in table[column])
    assert list(table["pairs"]) == [f"{n:,}" for n in rounds["num_pairs"]]
    # Candidates are the collected ones that pairs are made of; the evaluation's samples are counted apart.
    cur = _store(seeded).cursor()
    for r in (1, 2):
        collected, evaluated = cur.execute(
            "SELECT count(*) FILTER (WHERE side <> 'eval'), count(*) FILTER (WHERE side = 'eval') FROM candidates "
            "WHERE run_id = ? AND round = ?",
            [seeded.run_id, r],
        ).fetchone()
        assert evaluated > 0
        assert table.loc[r - 1, "candidates"] == f"{collected:,}"
        assert table.loc[r - 1, "evaluation samples"] == f"{evaluated:,}"
    assert all(at.button(key=state.phase_button_key(p)).disabled for p in ("collect", "select", "train", "evaluate"))
    timeline = _plotly(at)[0]
    assert {trace["name"] for trace in timeline["data"]} >= {"collect", "train", "evaluate"}


def test_rounds_shows_what_each_checkpoint_cost(open_app, seeded):
    from comlrl_lab.trainers.preference.runtime import checkpoint as ckpt

    at = open_app("pages/rounds.py")
    assert [s.value for s in at.subheader] == ["Phase timeline", "Checkpoints"]
    table = at.dataframe[1].value
    # The seeded run checkpoints after every phase and keeps them all: one folder per row, in the same order.
    folders = ckpt.checkpoint_dirs(seeded.root / seeded.run_id / "checkpoint")
    assert list(zip(table["round"], table["phase"])) == [
        (r, label) for r in (1, 2) for label in ("Collect", "Select replay sample", "Train", "Evaluate")
    ]
    assert len(folders) == len(table) == 8
    for megabytes, folder, phase in zip(table["MB written"], folders, table["phase"]):
        files = {p.name: p.stat().st_size for p in folder.iterdir()}
        # A weights file is written by a train phase; the phases after it link to it, which costs nothing.
        state_files = (ckpt.STATE_FILE, ckpt.TENSORS_FILE)
        written = sum(
            size for name, size in files.items() if name in state_files or (phase == "Train" and name != ckpt.COST_FILE)
        )
        assert megabytes == pytest.approx(written / 1e6, rel=1e-12)
    assert (table["seconds holding up training"] > 0).all()
    # The seeded run writes in the foreground: no background column to fill with "None".
    assert list(table.columns) == ["round", "phase", "seconds holding up training", "MB written"]
    (caption,) = [c.value for c in at.caption if "holding up training" in c.value]
    assert caption.startswith(f"8 checkpoints · {table['seconds holding up training'].sum():.2f} s holding up")
    assert f"{table['MB written'].sum():.2f} MB written" in caption and "written in the background" not in caption


def test_rounds_creates_a_run_from_setup_then_runs_one_phase(open_app, seeded, tmp_path):
    at = open_app(root=tmp_path, run_id=None)
    if seeded.model != model_picker.TINY_MODEL_NAME:
        for i in range(2):
            at.selectbox(key=state.agent_source_key(i)).select(model_picker.OTHER).run()
            at.text_input(key=state.agent_model_key(i)).input(seeded.model).run()
    at.number_input(key=state.SETUP_MAX_TRAIN_ITEMS).set_value(2)
    for name, value in {"num_iterations": 1, "preference_num_candidates": 2, "max_new_tokens": 4}.items():
        at.number_input(key=state.config_field_key("MADPOIter", name)).set_value(value)
    at.run()
    at.button(key=state.SETUP_CREATE).click().run()
    assert not at.exception
    assert at.title[0].value == "Rounds"
    run_id = at.session_state[state.RUN_ID]
    assert at.button(key=state.phase_button_key("collect")).disabled is False
    assert at.button(key=state.phase_button_key("train")).disabled is True

    at.button(key=state.phase_button_key("collect")).click().run()
    progress = services.workspace().manager.wait(run_id, timeout=300)
    assert progress.status == "idle" and progress.next_phase == "select", progress.last_error
    at.run()
    table = at.dataframe[0].value
    assert table.loc[0, "Collect"].startswith("✓") and table.loc[0, "Select replay sample"] == "next"
    assert table.loc[0, "pairs"] == f"{services.workspace().view(run_id).store.pairs_count(run_id):,}"
    assert at.button(key=state.phase_button_key("select")).disabled is False


def test_rounds_shows_a_failed_phase_with_its_cause_and_a_retry(open_app, seeded, tmp_path):
    import shutil

    from workbench_fixtures import seed_spec

    from comlrl_lab.models.tiny_model import tiny_model_path

    at = open_app(root=tmp_path, run_id=None)
    # A whole model passes the checks made before the run directory; its tokenizer is gone by the time collect loads it.
    model = shutil.copytree(tiny_model_path(), tmp_path / "vanishing-model")
    run_id = services.workspace().create_run(seed_spec(str(model)))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()
    at.session_state[state.RUN_ID] = run_id
    at.switch_page("pages/rounds.py").run()
    at.button(key=state.phase_button_key("collect")).click().run()
    services.workspace().manager.wait(run_id, timeout=120)
    at.run()
    errors = [e.value for e in at.error]
    assert any("The last phase failed" in e and "tokenizer" in e for e in errors), errors  # the cause is shown
    assert at.button(key=state.ROUNDS_RETRY).label == "Retry collect"
    assert any("Nothing committed is lost" in c.value for c in at.caption)
    # The event log has the failure (here: loading the models) as an error of round 1, collect.
    events = services.workspace().view(run_id).store.events(run_id, level="error")
    assert len(events) == 1 and "tokenizer" in events.loc[0, "message"]
    assert (events.loc[0, "round"], events.loc[0, "phase"]) == (1, "collect")


def test_rounds_pause_lets_the_phase_finish_and_stops_before_the_next(open_app, seeded, tmp_path):
    from workbench_fixtures import seed_spec

    at = open_app(root=tmp_path, run_id=None)
    run_id = services.workspace().create_run(seed_spec(seeded.model))
    at.session_state[state.RUN_ID] = run_id
    at.switch_page("pages/rounds.py").run()
    at.button(key=state.ROUNDS_RUN_ALL).click().run()
    assert at.button(key=state.ROUNDS_PAUSE).disabled is False  # the worker is loading the models or running
    at.button(key=state.ROUNDS_PAUSE).click().run()
    progress = services.workspace().manager.wait(run_id, timeout=300)
    assert progress.status == "paused" and progress.next_phase is not None, progress
    at.run()
    assert any(":orange-badge[:material/pause_circle: paused]" in m.value for m in at.markdown)
    assert {m.label: m.value for m in at.metric}["ETA"] == "–"
    # The event log says what happened, newest first.
    events = at.dataframe[-1].value
    assert events["message"].iloc[0].startswith("paused before ") and events["message"].iloc[-1].startswith("started: ")
    assert any(m.startswith("pause asked") for m in events["message"])
    assert at.button(key=state.ROUNDS_PAUSE).disabled
    assert at.button(key=state.phase_button_key(progress.next_phase)).disabled is False
    assert {m.label: m.value for m in at.metric}["round"] == "1 / 2"


# -- Pairs --------------------------------------------------------------------------------------------------


def test_pairs_browses_filters_and_shows_both_sides_per_agent(open_app, seeded):
    at = open_app("pages/pairs.py")
    store = _store(seeded)
    total = store.pairs_count(seeded.run_id)
    assert any(f"**{words.counted(total, 'pair')}** match" in m.value for m in at.markdown)
    assert len(at.dataframe[0].value) == min(25, total)
    # The page box is not in the row's last column, under the table toolbar's corner.
    page_column = _container_holding(at, state.PAIRS_PAGE)

    def parent_of(node, target):
        for child in getattr(node, "children", {}).values():
            if child is target:
                return node
            found = parent_of(child, target)
            if found is not None:
                return found
        return None

    row = parent_of(at._tree, page_column)
    assert list(row.children.values()).index(page_column) < len(row.children) - 1

    first = at.selectbox(key=state.PAIRS_OPEN).value
    detail = store.pair_detail(seeded.run_id, *first)
    assert at.subheader[0].value == f"Round {first[0]} · pair {first[1]} · item {int(detail['item_index'])}"
    boxes = [_strip(h.value) for h in at.html]
    for i in range(2):
        assert any(detail["prompts"][i] in b for b in boxes)
        winner_box = _texts(at.get_by_key(state.pair_agent_key(i, "winner")), "html")
        loser_box = _texts(at.get_by_key(state.pair_agent_key(i, "loser")), "html")
        assert detail["winner_completions"][i] in _strip(winner_box[0])
        assert detail["loser_completions"][i] in _strip(loser_box[0])
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["winner reward"] == f"{detail['winner_reward']:.4g}"
    candidates = at.dataframe[1].value
    assert set(candidates["side"]) == {"current", "comparator"} and len(candidates) == 8  # 4 candidates per side

    at.segmented_control(key=state.PAIRS_SIDE).set_value("comparator").run()
    expected = store.pairs_count(seeded.run_id, winner_side="comparator")
    assert any(f"**{words.counted(expected, 'pair')}** match" in m.value for m in at.markdown)
    assert set(at.dataframe[0].value["winner side"]) <= {"comparator"}
    at.selectbox(key=state.PAIRS_ROUND).select(2).run()
    expected = store.pairs_count(seeded.run_id, winner_side="comparator", round=2)
    assert any(f"**{words.counted(expected, 'pair')}** match" in m.value for m in at.markdown)
    at.number_input(key=state.PAIRS_MIN_GAP).set_value(0.99).run()
    expected = store.pairs_count(seeded.run_id, winner_side="comparator", round=2, min_gap=0.99)
    assert any(f"**{words.counted(expected, 'pair')}** match" in m.value for m in at.markdown)


def test_the_url_keeps_the_open_run_and_setup_has_its_own_address(open_app, seeded, monkeypatch):
    at = open_app("pages/pairs.py")
    assert at.query_params[state.URL_RUN] == seeded.run_id  # written on every rerun, page switches included

    # A reload is a new session with the same URL: the Pairs page opens on the same run.
    monkeypatch.setenv(services.RUNS_DIR_ENV, str(seeded.root))
    reloaded = AppTest.from_file(APP, default_timeout=TIMEOUT)
    reloaded.query_params = dict(at.query_params)
    reloaded.run()
    reloaded.switch_page("pages/pairs.py").run()
    assert not reloaded.exception, [e.value for e in reloaded.exception]
    assert reloaded.session_state[state.RUN_ID] == seeded.run_id
    total = _store(seeded).pairs_count(seeded.run_id)
    assert any(f"**{words.counted(total, 'pair')}** match" in m.value for m in reloaded.markdown)

    # Streamlit serves its default page at "/" only: Setup must not be it, or /setup is "Page not found".
    paths = {info["url_pathname"] for info in reloaded._registered_pages.values()}
    assert {"setup", "rounds", "pairs", "replay", "learning", "data"} <= paths


def test_a_reload_keeps_the_pairs_filters_and_the_open_pair(open_app, seeded, monkeypatch):
    at = open_app("pages/pairs.py")
    at.selectbox(key=state.PAIRS_ROUND).select(2).run()
    at.number_input(key=state.PAIRS_MIN_GAP).set_value(0.05).run()
    keys = at.selectbox(key=state.PAIRS_OPEN).options
    at.selectbox(key=state.PAIRS_OPEN).select_index(1).run()
    opened = at.selectbox(key=state.PAIRS_OPEN).value
    assert not at.exception, [e.value for e in at.exception]
    assert (at.query_params[state.PAIRS_ROUND], at.query_params[state.PAIRS_MIN_GAP]) == ("2", "0.05")
    assert at.query_params[state.PAIRS_OPEN] == f"{opened[0]}:{opened[1]}" and len(keys) > 1

    # A reload is a new session on the same address: the same filters and the same open pair.
    monkeypatch.setenv(services.RUNS_DIR_ENV, str(seeded.root))
    reloaded = AppTest.from_file(APP, default_timeout=TIMEOUT)
    reloaded.query_params = {k: v for k, v in at.query_params.items()}
    reloaded.session_state[state.SETUP_PRESET] = forms.PRESET_NONE
    reloaded.run()
    reloaded.switch_page("pages/pairs.py").run()
    assert not reloaded.exception, [e.value for e in reloaded.exception]
    assert reloaded.selectbox(key=state.PAIRS_ROUND).value == 2
    assert reloaded.number_input(key=state.PAIRS_MIN_GAP).value == pytest.approx(0.05)
    assert reloaded.selectbox(key=state.PAIRS_OPEN).value == opened

    # A round the run does not have is said and dropped, not an error.
    bad = AppTest.from_file(APP, default_timeout=TIMEOUT)
    bad.query_params = {state.URL_RUN: seeded.run_id, state.PAIRS_ROUND: "99"}
    bad.session_state[state.SETUP_PRESET] = forms.PRESET_NONE
    bad.run()
    bad.switch_page("pages/pairs.py").run()
    assert not bad.exception and bad.selectbox(key=state.PAIRS_ROUND).value is None
    assert any("pairs.round: 99 no longer offered" in c.value for c in bad.caption)


def test_pairs_sql_box_answers_read_only_queries_and_refuses_writes(open_app, seeded, downloads):
    at = open_app("pages/pairs.py")
    at.text_area(key=state.SQL_QUERY).input(
        "SELECT round, count(*) AS n FROM pairs GROUP BY round ORDER BY round"
    ).run()
    at.button(key=state.SQL_RUN).click().run()
    result = at.dataframe[-1].value
    rounds = _store(seeded).rounds(seeded.run_id)
    assert list(result["n"]) == list(rounds["num_pairs"])
    csv = pd.read_csv(io.BytesIO(downloads[f"{seeded.run_id}-query.csv"]))
    assert list(csv["n"]) == list(rounds["num_pairs"])

    # The caption names every table a query may read, the reward_distributions table included.
    caption = next(c.value for c in at.caption if c.value.startswith("Read-only SQL"))
    assert all(re.search(rf"\b{name}\b", caption) for name in set(schema.TABLES) - {"schema_version"})
    at.text_area(key=state.SQL_QUERY).input(
        "SELECT round, sum(sample_count) AS n FROM reward_distributions WHERE series = 'candidate' GROUP BY round "
        "ORDER BY round"
    ).run()
    at.button(key=state.SQL_RUN).click().run()
    assert at.dataframe[-1].value["n"].tolist() == [2 * 8 * 4, 2 * 8 * 4]  # both sides, 8 items, 4 candidates

    at.text_area(key=state.SQL_QUERY).input("DELETE FROM pairs").run()
    at.button(key=state.SQL_RUN).click().run()
    assert any(e.value.startswith("Refused") for e in at.error)
    assert _store(seeded).pairs_count(seeded.run_id) == int(rounds["num_pairs"].sum())


def test_an_empty_query_and_a_bad_row_limit_are_refused_in_words(open_app):
    # Issue 49: an empty query did nothing (the last result vanished) and a negative row limit ran with the old one.
    at = open_app("pages/pairs.py")
    at.text_area(key=state.SQL_QUERY).input("").run()
    at.button(key=state.SQL_RUN).click().run()
    assert [e.value for e in at.error] == ["Refused: the query is empty"]
    at.text_area(key=state.SQL_QUERY).input("SELECT 1 AS one").run()
    at.number_input(key=state.SQL_LIMIT).set_value(-5).run()
    at.button(key=state.SQL_RUN).click().run()
    assert [e.value for e in at.error] == ["Refused: the row limit must be between 1 and 100,000, not -5."]
    assert not [d for d in at.dataframe if list(d.value.columns) == ["one"]]
    at.number_input(key=state.SQL_LIMIT).set_value(10).run()
    assert not at.error and at.dataframe[-1].value["one"].tolist() == [1]


# -- Replay -------------------------------------------------------------------------------------------------


def test_replay_rows_in_sql_hold_the_size_of_the_dataset_they_drew_from(open_app, seeded):
    # Issue 49: replay.num_pairs was NULL in every row, while the Replay page showed each dataset's size.
    at = open_app("pages/pairs.py")
    at.text_area(key=state.SQL_QUERY).input(
        "SELECT round, source_round, num_pairs FROM replay ORDER BY round, source_round"
    ).run()
    at.button(key=state.SQL_RUN).click().run()
    result = at.dataframe[-1].value
    sizes = dict(zip(_store(seeded).rounds(seeded.run_id)["round"], _store(seeded).rounds(seeded.run_id)["num_pairs"]))
    assert result["source_round"].tolist() == [1, 1, 2]  # round 2 of lambda_decay draws from rounds 1 and 2
    assert result["num_pairs"].tolist() == [sizes[s] for s in result["source_round"]] and min(sizes.values()) > 0


def test_replay_shows_weights_and_draws_and_recomputes_lambda_live(open_app, seeded):
    at = open_app("pages/replay.py")
    store = _store(seeded)
    replay = store.replay(seeded.run_id)
    round2 = replay[replay["round"] == 2]
    drawn = at.dataframe[0].value
    assert list(drawn["dataset (round)"]) == [1, 2]
    assert [round(w, 6) for w in drawn["weight"]] == [round(w, 6) for w in lambda_decay_weights(2, 0.5)]
    assert list(drawn["pairs drawn"]) == list(round2["drawn_count"])
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["training sample size"] == str(int(round2["drawn_count"].sum()))
    modes = at.dataframe[1].value.set_index("mode")
    assert (
        modes.loc["current", "datasets used"] == 1
        and modes.loc["this run: lambda_decay (λ = 0.5)", "datasets used"] == 2
    )

    def weights_text() -> str:
        return _texts(at.get_by_key(state.REPLAY_LAMBDA_TEXT), "markdown")[0]

    assert weights_text() == "round 1: **0.333** · round 2: **0.667**"
    at.slider(key=state.REPLAY_LAMBDA).set_value(0.8).run()
    w = lambda_decay_weights(2, 0.8)
    assert weights_text() == f"round 1: **{w[0]:.3f}** · round 2: **{w[1]:.3f}**"
    # The run's own row keeps the run's λ = 0.5; the slider moves the lambda_decay row of the comparison.
    modes = at.dataframe[1].value.set_index("mode")
    this_run, slider = modes.loc["this run: lambda_decay (λ = 0.5)"], modes.loc["lambda_decay (λ = 0.8)"]
    assert [float(this_run[c]) for c in modes.columns[:2]] == [round(x, 4) for x in lambda_decay_weights(2, 0.5)]
    assert [float(slider[c]) for c in modes.columns[:2]] == [round(x, 4) for x in w]  # shown with 4 decimals
    chart = next(c for c in _plotly(at) if c["data"][0].get("name") == "weight")
    assert [round(y, 6) for y in _array(chart["data"][0]["y"])] == [round(x, 6) for x in w]
    at.segmented_control(key=state.REPLAY_ROUND).set_value(1).run()
    assert at.dataframe[0].value["weight"].tolist() == [1.0]


# -- Learning -----------------------------------------------------------------------------------------------


def test_learning_plots_rewards_losses_margins_accuracy_and_distributions(open_app, seeded):
    at = open_app("pages/learning.py")
    store = _store(seeded)
    charts = _plotly(at)
    titles = [c["layout"]["title"]["text"] for c in charts if c["layout"].get("title")]
    assert titles[:4] == [
        "Rewards per round",
        "Preference loss per round (mean over updates)",
        "Log-prob margins per round",
        "Pair accuracy and current agents' win share",
    ]
    rewards = {t["name"]: _array(t["y"]) for t in charts[0]["data"] if t.get("fill") != "toself"}
    assert set(rewards) == {"candidates: current agents", "candidates: comparator", "evaluation (task reward)"}
    assert all(len(ys) == 2 for ys in rewards.values())
    eval_curve = store.eval_curve(seeded.run_id)
    evals = eval_curve[eval_curve["name"] == "eval/turn_1/reward_mean"].sort_values("round")["value"].tolist()
    assert [round(v, 6) for v in rewards["evaluation (task reward)"]] == [round(v, 6) for v in evals]
    # The evaluation's 95% CI is shaded: mean ± t(0.975, n-1) · SE per round, from the logged SE and n.
    (band,) = [t for t in charts[0]["data"] if t.get("fill") == "toself"]
    assert band["name"] == "evaluation: 95% CI"
    by_name = {
        n: eval_curve[eval_curve["name"] == n].sort_values("round")["value"].tolist() for n in set(eval_curve["name"])
    }
    sems, counts = by_name["eval/turn_1/reward_sem"], by_name["eval/num_samples"]
    t = {2: 12.706, 3: 4.303, 4: 3.182}
    highs = [m + t[int(n)] * e for m, e, n in zip(evals, sems, counts)]
    lows = [m - t[int(n)] * e for m, e, n in zip(evals, sems, counts)]
    assert [round(v, 6) for v in _array(band["y"])] == [round(v, 6) for v in highs + lows[::-1]]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["eval reward"] == f"{evals[-1]:.4f}"
    assert any(t.startswith("Candidate rewards in round 2") for t in titles)
    hist = next(
        c for c in charts if c["layout"].get("title", {}).get("text", "").startswith("Candidate rewards in round")
    )
    assert {t["marker"]["color"] for t in hist["data"]} == {"#2563eb", "#ea580c"}
    logged = next(c for c in charts if c["layout"].get("title", {}).get("text", "").startswith("Logged reward"))
    assert logged["layout"]["title"]["text"] == "Logged reward distribution, round 2"
    stored = store.binned_reward_distributions(seeded.run_id, 2)
    assert [t["name"] for t in logged["data"]] == [
        f"{row.series} {row.side} (n={row.sample_count})" for row in stored.itertuples()
    ]
    assert [int(v) for v in _array(logged["data"][0]["y"])] == [int(c) for c in stored["counts"][0]]
    assert len(_array(logged["data"][0]["x"])) == 16


# -- Data ---------------------------------------------------------------------------------------------------


def test_data_exports_parquet_and_round_files_with_filters(open_app, seeded, downloads):
    at = open_app("pages/data.py")
    store = _store(seeded)
    total = store.pairs_count(seeded.run_id)
    at.radio(key=state.EXPORT_FORMAT).set_value("parquet").run()
    assert any(f"**{words.counted(total, 'pair')}** will be exported" in m.value for m in at.markdown)
    at.button(key=state.EXPORT_BUILD).click().run()
    button = at.download_button(key=state.EXPORT_DOWNLOAD)
    name = button.label.removeprefix("Download ")
    frame = pd.read_parquet(io.BytesIO(downloads[name]))
    assert len(frame) == total
    assert {"prompts", "winner_completions", "loser_completions", "winner_side", "reward_gap"} <= set(frame.columns)

    at.segmented_control(key=state.EXPORT_SIDE).set_value("current").run()
    at.button(key=state.EXPORT_BUILD).click().run()
    name = at.download_button(key=state.EXPORT_DOWNLOAD).label.removeprefix("Download ")
    assert len(pd.read_parquet(io.BytesIO(downloads[name]))) == store.pairs_count(seeded.run_id, winner_side="current")

    at.radio(key=state.EXPORT_FORMAT).set_value("rounds").run()
    at.button(key=state.EXPORT_BUILD).click().run()
    name = at.download_button(key=state.EXPORT_DOWNLOAD).label.removeprefix("Download ")
    with zipfile.ZipFile(io.BytesIO(downloads[name])) as zf:
        names = sorted(zf.namelist())
        assert names == [
            "preference_replay/iteration_0001.json",
            "preference_replay/iteration_0002.json",
            "reward_distributions/iteration_0001.json",
            "reward_distributions/iteration_0002.json",
        ]
        payload = json.loads(zf.read(names[0]))
        logged = json.loads(zf.read(names[3]))
    assert payload["iteration"] == 1 and payload["num_pairs"] == len(payload["pairs"])
    run_file = seeded.root / seeded.run_id / "reward_distributions" / "iteration_0002.json"
    assert logged == json.loads(run_file.read_text())  # the export rebuilds the file the trainer wrote


def test_data_exports_trl_files_per_agent_zipped_with_their_card(open_app, seeded, downloads):
    at = open_app("pages/data.py")
    store = _store(seeded)
    at.radio(key=state.EXPORT_FORMAT).set_value("trl").run()
    at.segmented_control(key=state.EXPORT_SIDE).set_value("comparator").run()
    at.button(key=state.EXPORT_BUILD).click().run()
    name = at.download_button(key=state.EXPORT_DOWNLOAD).label.removeprefix("Download ")
    with zipfile.ZipFile(io.BytesIO(downloads[name])) as zf:
        folder = name.removesuffix(".zip")
        assert sorted(zf.namelist()) == [f"{folder}/{n}" for n in ("README.md", "agent_0.jsonl", "agent_1.jsonl")]
        rows = [json.loads(line) for line in zf.read(f"{folder}/agent_1.jsonl").decode("utf-8").splitlines()]
        card = zf.read(f"{folder}/README.md").decode("utf-8")
    pairs = [p for p in store.load_pairs(seeded.run_id) if p.winner_side == "comparator"]
    assert [(r["round"], r["prompt"], r["chosen"], r["rejected"]) for r in rows] == [
        (p.round_index, p.prompts[1], p.winner_completions[1], p.loser_completions[1]) for p in pairs
    ]
    assert f"- Run id: `{seeded.run_id}`" in card and "- Filters of this export: winner_side='comparator'" in card


def test_data_imports_a_comlrl_replay_directory_and_browses_it(open_app, seeded):
    at = open_app("pages/data.py")
    replay_dir = seeded.root / seeded.run_id / "preference_replay"
    at.text_input(key=state.IMPORT_DIR).input(str(replay_dir)).run()
    at.button(key=state.IMPORT_DIR_BUTTON).click().run()
    total = _store(seeded).pairs_count(seeded.run_id)
    assert any(f"Imported {total:,} pairs from 2 files" in s.value for s in at.success)
    at.button(key=state.IMPORT_OPEN).click().run()
    assert at.title[0].value == "Pairs"
    assert at.session_state[state.RUN_ID].startswith("import-")
    assert any(f"**{words.counted(total, 'pair')}** match" in m.value for m in at.markdown)
    # Every page copes with a pair set that has no engine, no candidates and no metrics.
    for page, title in (
        ("pages/rounds.py", "Rounds"),
        ("pages/replay.py", "Replay buffer"),
        ("pages/learning.py", "Learning"),
        ("pages/data.py", "Data"),
    ):
        at.switch_page(page).run()
        assert not at.exception, (page, [e.value for e in at.exception])
        assert at.title[0].value == title
        if page == "pages/rounds.py":
            assert not at.get("plotly_chart")  # no phase-time chart: an import's "phases" took microseconds
        if page == "pages/learning.py":
            assert any("imported pair set" in i.value and "no learning curves" in i.value for i in at.info)
    # In the pickers an import has a title, not "nan · nan".
    import_id = at.session_state[state.RUN_ID]
    row = next(r for r in services.past_runs().itertuples(index=False) if r.run_id == import_id)
    assert services.run_label(row) == f"{import_id} — imported CoMLRL pairs"
    assert services.run_label(
        next(r for r in services.past_runs().itertuples(index=False) if r.kind == "experiment")
    ) == (f"{seeded.run_id} — MADPOIter · length_ratio")


def test_a_hand_typed_link_to_a_pair_past_the_first_page_opens_that_pair(seeded, monkeypatch):
    # The app's own links carry pairs.page; one typed by hand (issue 49: ?run.open=...&pairs.open=2%3A40) does not.
    monkeypatch.setenv(services.RUNS_DIR_ENV, str(seeded.root))
    frame = _store(seeded).pairs_page(seeded.run_id, limit=10_000)
    assert len(frame) > 25  # more than one page of the browser
    last = (int(frame["round"].iloc[-1]), int(frame["pair_index"].iloc[-1]))
    fresh_app_caches()
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params = {state.URL_RUN: seeded.run_id, state.PAIRS_OPEN: f"{last[0]}:{last[1]}"}
    at.session_state[state.SETUP_PRESET] = forms.PRESET_NONE
    at.run()
    at.switch_page("pages/pairs.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.selectbox(key=state.PAIRS_OPEN).value == last
    assert at.number_input(key=state.PAIRS_PAGE).value == -(-len(frame) // 25)
    assert any(f"pair {last[1]}" in h.value for h in at.subheader)
