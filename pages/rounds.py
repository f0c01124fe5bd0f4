"""Rounds: run the next phase (collect, [label,] select, train, evaluate) or N rounds; live progress; pause, stop, retry."""

import streamlit as st

from comlrl_lab.ui import components, figures, frames, navigation, services, state, words
from comlrl_lab.ui.frames import PHASE_LABELS

navigation.ensure_router()

view = components.require_run("Create or open a run to step through its rounds.")
ws = services.workspace()

st.title("Rounds")
progress = ws.progress(view.run_id)
head_left, head_right = st.columns([4, 1], vertical_alignment="center")
with head_left:
    if view.spec is not None:
        agents = ", ".join(dict.fromkeys(view.spec.agent_models))
        task = view.spec.task or view.spec.user_task
        st.caption(
            f"Run `{view.run_id}` · {view.spec.algorithm} · task {task} · {words.counted(len(view.spec.agent_models), 'agent')} ({agents})"
        )
    else:
        st.caption(
            f"Pair set `{view.run_id}`, imported from CoMLRL round files: its rounds hold pairs only (no candidates, "
            "metrics or phase times), so nothing can be run or timed here. Browse it on the Pairs and Data pages."
        )
with head_right:
    components.status_badge(progress)

rounds = view.store.rounds(view.run_id)
durations, timeline_fig = figures.timeline(view.run_id, figures.data_version(rounds))
num_rounds = view.num_rounds

if progress is not None:
    busy = progress.busy
    cols = st.columns(4)
    shown_round = min(progress.round_index, num_rounds or progress.round_index)
    cols[0].metric("round", f"{shown_round} / {num_rounds}" if num_rounds else shown_round)
    if busy and progress.phase:
        cols[1].metric("running", PHASE_LABELS.get(progress.phase, progress.phase))
    else:
        cols[1].metric(
            "next phase", PHASE_LABELS.get(progress.next_phase or "", "done") if progress.next_phase else "done"
        )
    cols[2].metric("pairs collected", int(rounds["num_pairs"].sum()) if len(rounds) else 0)
    cols[3].metric("pairs drawn for training", int(rounds["num_drawn"].sum()) if len(rounds) else 0)
    notes = services.empty_round_notes(view.store, view.run_id)
    if notes:  # one box, however many rounds: the first five, then how many more
        more = [f"and {len(notes) - 5} more rounds like them"] if len(notes) > 5 else []
        lines = [note[0].upper() + note[1:] + "." for note in notes[:5]] + more
        st.warning("\n".join(f"- {line}" for line in lines), icon=":material/warning:")
    if progress.status == "awaiting labels":  # the progress panel below says how many wait
        st.page_link(
            navigation.PAIRS_PAGE, label="Label the comparisons on the Pairs page", icon=":material/how_to_vote:"
        )

    # -- controls ------------------------------------------------------------------------------------------
    def start(**how) -> None:
        try:
            ws.start(view.run_id, **how)
        except Exception as error:
            st.error(components.format_exception(error), icon=":material/block:")
        else:
            st.rerun()

    with st.container(border=True, key=state.ROUNDS_CONTROLS):
        st.markdown("**Next phase**")
        order = " → ".join(progress.phases)
        phase_cols = st.columns(len(progress.phases))
        for col, phase in zip(phase_cols, progress.phases):
            is_next = progress.next_phase == phase
            if col.button(
                PHASE_LABELS[phase],
                key=state.phase_button_key(phase),
                type="primary" if is_next and not busy else "secondary",
                disabled=busy or not is_next,
                width="stretch",
                help=f"Run the {phase} phase of round {progress.round_index}"
                if is_next
                else f"Phases run in order: {order}.",
            ):
                start(phase=phase)
        many_left, many_mid, many_right, pause_col, stop_col = st.columns(
            [1.1, 1.2, 1.2, 1, 1], vertical_alignment="bottom"
        )
        remaining = max(1, (num_rounds or 1) - progress.round_index + 1)
        if st.session_state.get(state.ROUNDS_COUNT, 1) > remaining:
            st.session_state[state.ROUNDS_COUNT] = remaining
        n = many_left.number_input(
            "Rounds to run",
            min_value=1,
            max_value=max(1, remaining),
            step=1,
            key=state.ROUNDS_COUNT,
            disabled=busy or progress.next_phase is None,
            help="Completes the current round first: N = 1 runs to the end of this round.",
        )
        if many_mid.button(
            f"Run {int(n)} round{'s' if n != 1 else ''}",
            key=state.ROUNDS_RUN_ROUNDS,
            disabled=busy or progress.next_phase is None,
            icon=":material/fast_forward:",
            width="stretch",
        ):
            start(rounds=int(n))
        if many_right.button(
            "Run to the end",
            key=state.ROUNDS_RUN_ALL,
            disabled=busy or progress.next_phase is None,
            icon=":material/skip_next:",
            width="stretch",
        ):
            start(rounds=remaining)
        if pause_col.button(
            "Pause",
            key=state.ROUNDS_PAUSE,
            disabled=not busy or progress.status in ("pausing", "stopping"),
            icon=":material/pause:",
            width="stretch",
            help="Let the current phase finish, then stop.",
        ):
            ws.pause(view.run_id)
            st.rerun()
        if stop_col.button(
            "Stop",
            key=state.ROUNDS_STOP,
            disabled=not busy or progress.status == "stopping",
            icon=":material/stop:",
            width="stretch",
            help="Cancel the current phase now; the run returns to its last finished phase.",
        ):
            ws.stop(view.run_id)
            st.rerun()

    components.progress_panel(view, progress)
    components.error_panel(view, progress)
    running = (progress.round_index, progress.phase) if busy and progress.phase else None
    cursor = (progress.round_index, progress.next_phase)
else:
    running, cursor = None, (0, None)

# -- phase timeline ------------------------------------------------------------------------------------------

st.subheader("Phase timeline")
phases = progress.phases if progress is not None else frames.PHASES
table = frames.phase_table(rounds, durations, num_rounds, cursor, running, phases)
if table.empty:
    st.caption(
        "No phase has finished yet. Start with Collect: the agents and the comparator sample candidates, the oracle scores them, and pairs form."
    )
else:
    st.dataframe(table, hide_index=True, width="stretch", key=state.ROUNDS_TIMELINE_TABLE)
    # An import was written in one go: its phase times are the import's, not training's, and would mislead.
    if timeline_fig is not None and progress is not None:
        st.plotly_chart(timeline_fig, key=state.ROUNDS_TIMELINE_CHART)
    if len(rounds):
        last = int(rounds["round"].max())
        links = st.columns(3)
        links[0].page_link(navigation.PAIRS_PAGE, label=f"Read the pairs of round {last}", icon=":material/compare:")
        links[1].page_link(navigation.REPLAY_PAGE, label="See the replay buffer", icon=":material/history:")
        links[2].page_link(navigation.LEARNING_PAGE, label="Watch the learning curves", icon=":material/monitoring:")

# Not cached with the timeline: a background checkpoint's cost arrives after its phase has committed.
costs = frames.checkpoint_costs(view.store.metrics(view.run_id, names=[frames.CHECKPOINT_PREFIX]))
if not costs.empty:
    with st.container(key=state.ROUNDS_CHECKPOINT_COST):
        st.subheader("Checkpoints")
        st.caption(frames.checkpoint_summary(costs))
        shown = frames.checkpoint_display(costs)
        st.dataframe(
            shown,
            hide_index=True,
            width="stretch",
            key=state.ROUNDS_CHECKPOINT_TABLE,
            column_config={
                label: st.column_config.NumberColumn(format="%.3f" if "seconds" in label else "%.2f")
                for label in frames.CHECKPOINT_COLUMNS.values()
                if label in shown.columns
            },
        )

events = view.store.events(view.run_id, limit=200)
with st.expander(f"Event log ({len(events)}{'+' if len(events) == 200 else ''})"):
    if events.empty:
        st.caption("No events yet: starts, finished phases, pauses, stops and errors are logged here.")
    else:
        st.dataframe(events.drop(columns=["traceback"]), hide_index=True, width="stretch")
