"""Learning: per-round rewards (candidates, comparator, evaluation), losses, margins, accuracy, reward distributions."""

import streamlit as st

from comlrl_lab.ui import components, figures, navigation, state

navigation.ensure_router()

view = components.require_run("Create or open a run to watch it learn.")
run_id = view.run_id

st.title("Learning")
st.caption(
    f"Run `{run_id}`. Candidate rewards are recorded at collection (before that round's update); evaluation samples "
    "fresh responses from the current policy after training and scores them with the task reward."
)

version = figures.data_version(view.store.rounds(run_id))
data = figures.learning(run_id, version)
if data is None:
    if view.spec is None:
        st.info(
            "This is an imported pair set: CoMLRL's round files hold the pairs and their rewards, not training "
            "metrics, candidates or evaluations, so there are no learning curves to draw. Its pairs are on the "
            "Pairs page; its replay datasets on the Replay page.",
            icon=":material/inventory_2:",
        )
    else:
        st.info("No metrics yet: they appear as phases finish on the Rounds page.")
    st.stop()

for col, tile in zip(st.columns(len(data.tiles)), data.tiles):
    col.metric(
        tile.label,
        tile.value,
        tile.delta,
        delta_color="inverse" if tile.inverse else "normal",
        help=tile.help,
        border=True,
    )

left, right = st.columns(2)
for col, name, empty in (
    (left, "rewards", "No reward recorded yet."),
    (right, "loss", "No training loss yet: it appears after the first Train phase."),
):
    with col:
        if name in data.figures:
            st.plotly_chart(data.figures[name], key=state.learning_chart_key(name))
        else:
            st.caption(empty)
# The winner NLL (MADPO), the policy-learning loss and the reward model's margins (MARLHF) get panels of their own.
# A code task's evaluation (pass@1, mean level reward) comes first, then the training panels.
panels = [
    name
    for name in ("pass_at_1", "level_reward", "nll", "rl_loss", "margins", "reward_margins", "accuracy")
    if name in data.figures
]
for start in range(0, len(panels), 2):
    for col, name in zip(st.columns(2), panels[start : start + 2]):
        col.plotly_chart(data.figures[name], key=state.learning_chart_key(name))

if st.toggle(
    "Show every optimiser update", key=state.LEARNING_PER_STEP, help="Per-update values instead of round means."
):
    fig = figures.step_curves(run_id, version, tuple(data.step_series))
    if fig is not None:
        st.plotly_chart(fig, key=state.LEARNING_STEP_CHART)

st.subheader("Reward distributions: current agents vs comparator")
if not data.has_distributions:
    st.caption("No scored candidates were stored yet (imported pair sets keep pairs only).")
    st.stop()
left, right = st.columns(2)
with left:
    state.follow_latest(state.LEARNING_ROUND, data.rounds)
    chosen = st.selectbox("Round", data.rounds, key=state.LEARNING_ROUND, format_func=lambda r: f"round {r}")
    st.plotly_chart(figures.reward_histogram(run_id, version, int(chosen)), key=state.LEARNING_REWARD_HIST)
with right:
    st.plotly_chart(data.figures["boxes"], key=state.LEARNING_REWARD_BOXES)
logged = figures.logged_distribution(run_id, version, int(chosen))
if logged is not None:
    st.plotly_chart(logged, key=state.LEARNING_LOGGED_DISTRIBUTION)
