"""The ui package's pieces outside any one page: shared pair filters, tables, figures and diffs.

Session-state keys are named in ``comlrl_lab.ui.state``: tests/test_architecture.py checks every page and ui module.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from comlrl_lab.ui import state

# -- the shared pair filters ----------------------------------------------------------------------------------


def _filters_app() -> None:
    import pandas as pd
    import streamlit as st

    from comlrl_lab.ui import components, state

    rounds = pd.DataFrame({"round": [1, 2, 3]})
    st.json({"pairs": components.pair_filters(rounds, state.PAIRS_FILTERS)})
    st.json({"export": components.pair_filters(rounds, state.EXPORT_FILTERS, heading="**Filters**")})


def test_pair_filters_return_the_store_keywords_and_keep_each_page_s_choices_apart():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_function(_filters_app, default_timeout=30).run()
    empty = {"round": None, "winner_side": None, "item": None, "min_gap": None, "max_gap": None, "text": None}
    assert [json.loads(j.value) for j in at.json] == [{"pairs": empty}, {"export": empty}]
    assert at.selectbox(key=state.PAIRS_ROUND).options == ["all", "round 1", "round 2", "round 3"]

    at.selectbox(key=state.PAIRS_ROUND).select(2)
    at.segmented_control(key=state.PAIRS_SIDE).set_value("comparator")
    at.number_input(key=state.PAIRS_ITEM).set_value(4)
    at.number_input(key=state.PAIRS_MIN_GAP).set_value(0.25)
    at.number_input(key=state.PAIRS_MAX_GAP).set_value(0.75)
    at.text_input(key=state.PAIRS_TEXT).input("  hello  ")
    at.segmented_control(key=state.EXPORT_SIDE).set_value("current").run()
    assert json.loads(at.json[0].value) == {
        "pairs": {"round": 2, "winner_side": "comparator", "item": 4, "min_gap": 0.25, "max_gap": 0.75, "text": "hello"}
    }
    assert json.loads(at.json[1].value) == {"export": {**empty, "winner_side": "current"}}
    assert [m.value for m in at.markdown] == ["**Filters**"]
    assert at.get_by_key(state.PAIRS_FILTERS.box) is not None and at.get_by_key(state.EXPORT_FILTERS.box) is not None


def test_the_phase_table_shows_a_dash_for_counts_of_rounds_not_reached_yet():
    import pandas as pd

    from comlrl_lab.ui import frames

    rounds = pd.DataFrame(
        [
            {
                "round": 1,
                "collect_at": pd.Timestamp("2026-01-01"),
                "num_candidates": 256,
                "num_pairs": 1200,
                "num_drawn": 0,
                "num_eval_samples": 4,
            }
        ]
    )
    table = frames.phase_table(rounds, {}, 2, (1, "select"))
    assert table.loc[0, ["candidates", "pairs", "drawn for training", "evaluation samples"]].tolist() == [
        "256",
        "1,200",
        "0",
        "4",
    ]
    assert table.loc[1, ["candidates", "pairs", "drawn for training", "evaluation samples"]].tolist() == ["–"] * 4


def test_a_labelled_runs_phase_table_and_timeline_have_the_label_phase():
    import pandas as pd

    from comlrl_lab.names.phases import round_phases
    from comlrl_lab.ui import frames

    rounds = pd.DataFrame(
        [
            {
                "round": 1,
                "collect_at": pd.Timestamp("2026-01-01 10:00:00"),
                "label_at": pd.Timestamp("2026-01-01 10:05:00"),
                "num_candidates": 8,
                "num_pairs": 8,
                "num_drawn": 0,
                "num_eval_samples": 0,
            }
        ]
    )
    durations = {(1, "collect"): 2.0, (1, "label"): 0.5}
    table = frames.phase_table(rounds, durations, 1, (1, "select"), phases=round_phases("human"))
    phases = ["Collect", "Label", "Select replay sample", "Train", "Evaluate"]
    assert [c for c in table.columns if c in frames.PHASE_LABELS.values()] == phases
    assert table.loc[0, phases].tolist() == ["✓ 2.0 s", "✓ 0.5 s", "next", "·", "·"]
    assert "Label" not in frames.phase_table(rounds, durations, 1, (1, "select")).columns  # a reward run: four
    spans = frames.timeline(rounds, durations)
    assert spans[["phase", "seconds"]].values.tolist() == [["collect", 2.0], ["label", 0.5]]
    timed = pd.DataFrame([{"round": 1, "name": "time/label_seconds", "value": 0.5}])
    assert frames.phase_durations(timed) == {(1, "label"): 0.5}


def test_the_label_queue_leaves_out_what_the_labeller_gave_what_is_complete_and_what_they_skipped():
    from comlrl_lab.data.labels import Label
    from comlrl_lab.ui.labelling import queue

    labels = [
        Label(1, 0, "ann", "A", "winner"),
        Label(1, 1, "bob", "B", "loser"),
        Label(1, 3, "bob", "tie", "winner"),
        Label(1, 3, "cy", "A", "winner"),
        Label(2, 2, "ann", "A", "winner"),  # another round: not counted
    ]
    one = queue(5, 1, labels, 1, "ann", {(1, 2)})
    assert (one.todo, one.skipped, one.complete, one.total, one.mine) == ([4], [2], 3, 5, 1)
    two = queue(5, 1, labels, 2, "ann", {(1, 2)})  # two labels each: 1 waits for a second, 3 is complete
    assert (two.todo, two.skipped, two.complete, two.mine) == ([1, 4], [2], 1, 1)
    assert queue(5, 1, labels, 2, "bob", set()).todo == [0, 2, 4]


def test_the_verdict_reveals_where_each_shown_side_came_from():
    from comlrl_lab.data.labels import Label
    from comlrl_lab.data.records import PreferencePair
    from comlrl_lab.ui.labelling import reveal

    pair = PreferencePair(["p"], ["w"], ["l"], 0.75, 0.25, 0.5, winner_side="comparator")
    assert reveal(pair, Label(1, 4, "ann", "B", "loser")) == (
        "Comparison 5: you said “B is better”. A was the current side, reward 0.25; B was the comparator side, "
        "reward 0.75."
    )


def _metrics(values: dict[str, list[float]]):
    import pandas as pd

    rows = [
        {"round": r + 1, "step": r + 1, "phase": "train", "name": name, "value": v}
        for name, per_round in values.items()
        for r, v in enumerate(per_round)
    ]
    return pd.DataFrame(rows)


def test_marlhf_losses_and_reward_model_margins_get_panels_of_their_own():
    from comlrl_lab.names import metric_names as m
    from comlrl_lab.ui import figures

    panels = figures.training_panels(
        _metrics({m.BT_LOSS: [0.69, 0.52], m.RL_LOSS: [104.0, 96.0], m.BT_MARGIN: [0.1, 1.4]})
    )
    assert set(panels) == {"loss", "rl_loss", "reward_margins"}
    assert [t.name for t in panels["loss"].data] == [m.BT_LOSS]  # not on the RL loss's axis, where 0.5 looks flat
    assert [t.name for t in panels["rl_loss"].data] == [m.RL_LOSS]
    assert panels["reward_margins"].layout.yaxis.title.text == "reward margin R(w) - R(l)"


def test_an_agents_margin_stays_visible_on_the_joint_margin():
    from comlrl_lab.names import metric_names as m
    from comlrl_lab.ui import figures

    agent = m.name(m.MADPO_AGENT_MARGIN, agent=1)
    panels = figures.training_panels(_metrics({m.MADPO_JOINT_MARGIN: [0.5, 0.9], agent: [0.5, 0.9]}))
    assert panels["margins"].layout.yaxis.title.text == "log-prob margin"
    first, second = panels["margins"].data
    assert first.line.dash != second.line.dash and first.marker.symbol != second.marker.symbol


def test_words_in_common_counts_words_not_spaces_and_says_how():
    from comlrl_lab.ui import diff

    assert diff.similarity("the cat sat down", "the cat sat up") == 0.75
    assert diff.similarity("", "") == 1.0
    assert "2 × (words matched in order)" in diff.SIMILARITY_HELP


def test_the_pair_chart_leaves_room_for_the_winner_label_above_the_best_candidate():
    import pandas as pd

    from comlrl_lab.ui import charts

    frame = pd.DataFrame({"side": ["current"] * 3, "candidate_index": [0, 1, 2], "reward": [0.2, 0.5, 1.0]})
    fig = charts.candidate_rewards(frame, winner=("current", 2), loser=("current", 0))
    winner = next(t for t in fig.data if t.name == "winner")
    assert winner.cliponaxis is False
    assert fig.layout.yaxis.range[1] > 1.0 + 0.1 and fig.layout.yaxis.range[0] < 0.2


def test_checkpoint_costs_show_background_seconds_only_when_some_were_written_in_the_background():
    import pandas as pd

    from comlrl_lab.names import metric_names as M
    from comlrl_lab.ui import frames

    def metric(phase, template, value):
        return {"round": 1, "phase": phase, "name": M.name(template, phase=phase), "value": value}

    foreground = pd.DataFrame(
        [metric("collect", M.CHECKPOINT_SECONDS, 0.5), metric("collect", M.CHECKPOINT_BYTES, 2e6)]
        + [metric("train", M.CHECKPOINT_SECONDS, 0.25), metric("train", M.CHECKPOINT_BYTES, 3e6)]
    )
    shown = frames.checkpoint_display(frames.checkpoint_costs(foreground))
    assert shown.to_dict("records") == [
        {"round": 1, "phase": "Collect", "seconds holding up training": 0.5, "MB written": 2.0},
        {"round": 1, "phase": "Train", "seconds holding up training": 0.25, "MB written": 3.0},
    ]
    mixed = pd.concat([foreground, pd.DataFrame([metric("train", M.CHECKPOINT_BACKGROUND_SECONDS, 1.5)])])
    shown = frames.checkpoint_display(frames.checkpoint_costs(mixed))
    assert list(shown["seconds in the background"]) == [0.0, 1.5]  # the collect checkpoint: none in the background


def test_the_server_does_not_collect_all_garbage_after_every_script_run():
    # Streamlit's default gc.collect(2) after each run (a live-progress fragment reruns every second) holds the GIL
    # for 0.3-1.2 s with torch and transformers loaded, which starved the training thread of a watched run.
    import tomllib

    config = tomllib.loads((Path(__file__).resolve().parents[1] / ".streamlit" / "config.toml").read_text())
    assert config["runner"]["postScriptGC"] is False


def test_the_madpo_loss_card_shows_the_dpo_loss_and_the_winner_nll_gets_its_own_panel():
    from comlrl_lab.names import metric_names as m
    from comlrl_lab.ui import figures

    nll = m.name(m.MADPO_WINNER_NLL, agent=1)
    metrics = _metrics({m.MADPO_LOSS: [0.6931, 0.6745], nll: [1.5010, 1.4587]})
    tiles = {t.label: t for t in figures.learning_tiles(metrics)}
    assert (tiles["DPO / BT loss"].value, tiles["DPO / BT loss"].delta) == ("0.6745", "-0.0186")
    panels = figures.training_panels(metrics)
    assert [t.name for t in panels["loss"].data] == [m.MADPO_LOSS]  # an NLL near 1.5 is not on the loss's axis
    assert [t.name for t in panels["nll"].data] == [nll]
    # MARLHF: the Bradley-Terry fit's loss, not its held-out loss.
    marlhf = figures.learning_tiles(_metrics({m.BT_LOSS: [0.60, 0.52], m.BT_VAL_LOSS: [0.7, 0.9]}))
    assert {t.label: t.value for t in marlhf}["DPO / BT loss"] == "0.5200"


def _is_call(statement: ast.stmt) -> bool:
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)


def test_the_screens_are_in_the_pages_folder_each_guarded_and_title_case_addresses_lead_to_them(tmp_path, monkeypatch):
    # With a pages/ folder beside app.py, a freshly started server runs a page's file without app.py (Streamlit's old
    # folder mode) until some session has called st.navigation: every page therefore hands itself to the router first.
    from streamlit.testing.v1 import AppTest

    from comlrl_lab.ui import services

    root = Path(__file__).resolve().parents[1]
    assert not (root / "app_pages").exists()
    screens = sorted((root / "pages").glob("*.py"))
    assert [p.stem for p in screens] == ["compare", "data", "learning", "pairs", "replay", "rounds", "setup"]
    for screen in screens:  # the guard runs before the page draws anything: its first statement after the imports
        statements = ast.parse(screen.read_text(encoding="utf-8")).body
        code = [s for s in statements if not isinstance(s, (ast.Import, ast.ImportFrom, ast.Expr)) or _is_call(s)]
        first = code[0]
        assert ast.unparse(first) == "navigation.ensure_router()", screen.name
    monkeypatch.setenv(services.RUNS_DIR_ENV, str(tmp_path))
    at = AppTest.from_file(str(root / "app.py"), default_timeout=60).run()
    paths = {info["url_pathname"] for info in at._registered_pages.values()}
    assert {"setup", "rounds", "pairs", "replay", "learning", "compare", "data"} <= paths
    assert {"Setup", "Rounds", "Pairs", "Replay", "Learning", "Compare", "Data"} <= paths
    services.close_all()


def test_a_dataset_a_replay_mode_cannot_use_shows_an_empty_cell_not_none():
    from comlrl_lab.ui import frames

    table = frames.mode_weights({1: 8, 2: 8, 3: 8}, 3, view={"preference_replay_k": 1, "preference_replay_lambda": 0.5})
    view = frames.mode_weights_view(table).set_index("mode")
    # Rounds 1 and 2 are not eligible under k = 1: empty cells, which st.dataframe draws empty (a NaN shows "None").
    assert view.loc["nearest_k (k = 1)"].tolist() == ["", "", "1.0000", 1]


def test_every_optimiser_update_is_drawn_one_panel_per_kind_of_quantity():
    from comlrl_lab.names import metric_names as m
    from comlrl_lab.ui import charts, figures

    agent = m.name(m.MADPO_AGENT_MARGIN, agent=1)
    nll = m.name(m.MADPO_WINNER_NLL, agent=1)
    names = [m.MADPO_LOSS, nll, m.MADPO_JOINT_MARGIN, agent, m.MADPO_PAIR_ACCURACY]
    panels = figures.step_panels(names)
    assert panels == [
        ("DPO / Bradley-Terry loss", [m.MADPO_LOSS]),
        ("per-token NLL of the winner", [nll]),
        ("log-prob margin", [m.MADPO_JOINT_MARGIN, agent]),
        ("share", [m.MADPO_PAIR_ACCURACY]),
    ]
    steps = _metrics({name: [0.5, 0.6] for name in names}).rename(columns={"name": "series"})
    fig = charts.step_curves(steps, panels, title="Per update")
    axes = {trace.name: trace.yaxis for trace in fig.data}
    assert axes[m.MADPO_LOSS] == "y" and axes[nll] == "y2" and axes[agent] == axes[m.MADPO_JOINT_MARGIN] == "y3"
    assert axes[m.MADPO_PAIR_ACCURACY] == "y4"


def test_no_page_text_uses_a_glyph_the_workbench_font_lacks():
    # "hover the ⓘ" rendered as an empty box in Chromium: Streamlit's help icon is a question mark.
    root = Path(__file__).resolve().parents[1]
    for path in [*root.glob("pages/*.py"), *root.glob("comlrl_lab/ui/*.py")]:
        assert "ⓘ" not in path.read_text(encoding="utf-8"), path
