"""The ui package's pieces outside any one page: shared pair filters, tables, figures and diffs.

Session-state keys are named in ``comlrl_lab.ui.state``: tests/test_architecture.py checks every page and ui module.
"""

from __future__ import annotations

import json

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
