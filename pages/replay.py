"""Replay: per round, the datasets each replay mode can use and their weights, and what each one gave to training."""

import streamlit as st

from comlrl_lab.ui import charts, components, figures, frames, navigation, state

navigation.ensure_router()

view = components.require_run("Create or open a run to see its replay buffer.")
store, run_id = view.store, view.run_id

st.title("Replay buffer")
settings = view.settings  # the run's stored config values, as the engine validated them: read once
mode = settings.get("preference_replay_mode")
if view.iterative:
    st.caption(
        f"Run `{run_id}` uses **{mode}**{frames.replay_setting(settings)}. Each round adds its pairs as one dataset "
        "D_ν; the training sample B^(ν) is drawn from the datasets the mode allows, each picked by its weight."
    )
elif view.spec is not None:
    st.caption(
        f"Run `{run_id}` ({view.spec.algorithm}) trains on the pairs it collected once; it has no replay buffer. "
        "The mode comparison below shows what the iterative trainers would use."
    )
else:
    st.caption(f"Pair set `{run_id}` was imported: its rounds are the datasets; nothing was drawn from them here.")

rounds = store.rounds(run_id)
if rounds.empty:
    st.info("No round has collected pairs yet: run a Collect phase on the Rounds page.")
    st.stop()
sizes = frames.dataset_sizes(rounds)
round_list = sorted(sizes)
state.follow_latest(state.REPLAY_ROUND, round_list)
version = figures.data_version(rounds)
if 1 < len(round_list) <= 16:
    nu = st.segmented_control(
        "Round ν",
        round_list,
        key=state.REPLAY_ROUND,
        format_func=lambda r: f"round {r}",
        required=True,
    )
elif len(round_list) > 16:
    nu = st.select_slider("Round ν", round_list, key=state.REPLAY_ROUND, format_func=lambda r: f"round {r}")
else:
    nu = round_list[0]
    st.caption(f"Round ν = {nu} (the only round so far)")

# -- what the run drew ---------------------------------------------------------------------------------------

st.subheader(f"What round {nu} trained on")
drawn, draws_fig = figures.replay_draws(run_id, version, int(nu))
cols = st.columns(4)
cols[0].metric("pairs collected in this round", sizes.get(nu, 0))
cols[1].metric("datasets used", len(drawn))
cols[2].metric(
    "training sample size",
    int(drawn["drawn_count"].sum()) if len(drawn) else 0,
    help="preference_replay_sample_size, or by default this round's pair count.",
)
cols[3].metric("replay mode", mode or "–")
if drawn.empty:
    st.caption("The select phase of this round has not run yet (or the run has no replay buffer).")
else:
    left, right = st.columns([3, 2])
    left.plotly_chart(draws_fig, key=state.REPLAY_DRAWS_CHART)
    right.dataframe(
        drawn.rename(
            columns={"source_round": "dataset (round)", "drawn_count": "pairs drawn", "available": "pairs in dataset"}
        ),
        hide_index=True,
        width="stretch",
        key=state.REPLAY_DRAWS_TABLE,
        column_config={"weight": st.column_config.NumberColumn(format="%.4f")},
    )

# -- every mode ------------------------------------------------------------------------------------------------


# The comparison below reruns on its own when λ or k moves (a fragment): a quick rerun keeps the tables in step
# with the slider even when it is dragged fast, where a whole-page rerun per step fell behind.
@st.fragment
def mode_comparison() -> None:
    st.subheader(f"What each mode can use in round {nu}")
    st.caption(
        "Weights per round dataset (blank: not eligible). nearest_k and all_history weight every eligible dataset "
        "equally whatever its size; lambda_decay favours the newest."
    )
    k_col, lam_col = st.columns(2)
    # The view starts at the run's own k and λ, else at the values the Setup form suggests for them.
    start = frames.replay_view_start(settings)
    st.session_state.setdefault(state.REPLAY_K, start["preference_replay_k"])
    st.session_state.setdefault(state.REPLAY_LAMBDA, start["preference_replay_lambda"])
    labels = frames.replay_labels()
    k_value = k_col.number_input(labels["preference_replay_k"], min_value=1, step=1, key=state.REPLAY_K)
    lam_value = lam_col.slider(
        labels["preference_replay_lambda"],
        min_value=0.0,
        max_value=1.0,
        step=0.01,
        key=state.REPLAY_LAMBDA,
        help="0 keeps only the newest dataset; 1 weights every dataset equally. The weights below follow as you move it.",
    )
    view_settings = {"preference_replay_k": int(k_value), "preference_replay_lambda": float(lam_value)}
    st.dataframe(
        frames.mode_weights_view(frames.mode_weights(sizes, nu, view=view_settings, run=settings)),
        hide_index=True,
        width="stretch",
        key=state.REPLAY_MODE_WEIGHTS,
    )

    eligible = frames.eligible_rounds(sizes, nu)
    if eligible:
        table = frames.lambda_table(
            eligible,
            float(lam_value),
            sample_size=int(drawn["drawn_count"].sum())
            if len(drawn)
            else settings.get("preference_replay_sample_size"),
        )
        left, right = st.columns([3, 2])
        left.plotly_chart(
            charts.lambda_weights(eligible, table["weight"].tolist(), lam=float(lam_value)),
            key=state.REPLAY_LAMBDA_CHART,
        )
        with right:
            st.markdown("**λ-decay weights, oldest → newest**")
            with st.container(key=state.REPLAY_LAMBDA_TEXT):
                st.markdown(
                    " · ".join(f"round {r}: **{w:.3f}**" for r, w in zip(table["source round"], table["weight"]))
                )
            shown = table.assign(**{"source round": [f"round {r}" for r in table["source round"]]}).set_index(
                "source round"
            )
            st.table(shown.style.format({"weight": "{:.4f}", "expected pairs": "{:.1f}"}))
            lam = settings.get("preference_replay_lambda")  # set only when the run's mode uses it
            if lam is not None and abs(float(lam_value) - float(lam)) > 1e-9:
                st.caption(f"The run itself used λ = {lam}; this view is what λ = {lam_value:g} would give.")
    else:
        st.caption("No non-empty round dataset up to this round.")


mode_comparison()
