"""Pieces several pages share: the open-run guard, the sidebar run card, the live progress panel, pair filters, a pair view.

The progress panel is an ``st.fragment`` that polls ``RunManager.progress`` every ``PANEL_POLL_S`` seconds while the
run is busy (and not at all when idle), and asks for a full rerun when a phase finishes so the rest of the page
catches up. It reads only the engine's lock-protected snapshot, never the store; what a redraw costs training is
the server's threads taking the GIL, so the page polls as little as a live view allows.
"""

from __future__ import annotations

import json
import traceback as tb
from typing import Any

import pandas as pd
import streamlit as st

from comlrl_lab.engine import eta
from comlrl_lab.engine.manager import PHASE_UNITS, Progress
from comlrl_lab.ui import diff, figures, frames, services, state
from comlrl_lab.ui.frames import PHASE_LABELS
from comlrl_lab.ui.navigation import DATA_PAGE, SETUP_PAGE
from comlrl_lab.ui.url_state import UrlKey

STATUS_BADGES = {
    "idle": ("idle", "gray", ":material/pause_circle:"),
    "loading": ("loading models", "blue", ":material/hourglass_top:"),
    "running": ("running", "blue", ":material/progress_activity:"),
    "pausing": ("pausing after this phase", "orange", ":material/pause:"),
    "paused": ("paused", "orange", ":material/pause_circle:"),
    "stopping": ("stopping", "orange", ":material/stop_circle:"),
    "error": ("error", "red", ":material/error:"),
    "finished": ("finished", "green", ":material/check_circle:"),
    "awaiting labels": ("awaiting labels", "violet", ":material/how_to_vote:"),
    "interrupted": ("interrupted (resume it)", "orange", ":material/stop_circle:"),
}


def require_run(purpose: str) -> services.RunView:
    """The open run, or a note with links to Setup and Data, then stop the page."""
    run_id = state.current_run_id()
    ws = services.workspace()
    if run_id and ws.has_run(run_id):
        try:
            return ws.view(run_id)
        except Exception as error:  # a folder removed or a store that cannot be opened
            st.error(f"Run {run_id} cannot be opened: {type(error).__name__}: {error}")
            state.set_current_run(None)
    elif run_id:  # a link naming a run that is gone, or a path that is no run of the runs folder
        st.warning(f"`{run_id}` is not a run in the runs folder `{ws.root}`; nothing was opened.")
        state.set_current_run(None)
    st.info(f"No run is open. {purpose}", icon=":material/info:")
    cols = st.columns(2)
    cols[0].page_link(SETUP_PAGE, label="Set up a new experiment or reopen a past run", icon=":material/science:")
    cols[1].page_link(DATA_PAGE, label="Import a CoMLRL replay directory", icon=":material/upload:")
    st.stop()


def status_badge(progress: Progress | None) -> None:
    if progress is None:
        st.badge("imported pairs", color="violet", icon=":material/inventory_2:")
        return
    label, color, icon = STATUS_BADGES.get(progress.status, (progress.status, "gray", None))
    st.badge(label, color=color, icon=icon)


def progress_text(progress: Progress) -> str:
    """One line about the work in hand: "Round 2/5 · Collect · 64/128 prompts · 1,820 tok/s · ETA 12s"."""
    rounds = f"/{progress.num_rounds}" if progress.num_rounds else ""
    if progress.status == "loading":
        parts = [f"Loading models for round {progress.shown_round}{rounds}", f"{progress.elapsed():.0f}s so far"]
        left = progress.eta()
        parts.append(f"ETA {eta.text(left)}" if left is not None else "first load: no estimate yet")
        return " · ".join(parts)
    phase = progress.phase or progress.next_phase
    parts = [f"Round {progress.shown_round}{rounds} · {PHASE_LABELS.get(phase or '', phase or '')}"]
    if progress.total:
        unit = PHASE_UNITS.get(phase or "", "step")
        parts.append(f"{progress.done}/{progress.total} {unit}{'s' if progress.total != 1 else ''}")
    if progress.tokens_per_second:
        parts.append(f"{progress.tokens_per_second:,.0f} tok/s")
    if progress.busy:
        left = progress.eta()
        parts.append(f"ETA {eta.text(left)}" if left is not None else "finishing…")
    return " · ".join(parts)


# -- sidebar ------------------------------------------------------------------------------------------------


def _choose_run() -> None:
    state.set_current_run(st.session_state.get(state.SIDEBAR_RUN))


#: Seconds between live-progress redraws. Each redraw is a fragment run in the server, whose threads take the GIL
#: from the training thread; on two shared cores every such hand-over costs the training thread a scheduler slice.
PANEL_POLL_S = 2.0
SIDEBAR_POLL_S = 5.0


def sidebar_run_card(*, poll: bool = True) -> None:
    """Run picker and a small live status card, shown on every page; ``poll`` False leaves the live redraws to the
    page (the Rounds page has its own progress panel)."""
    past = services.past_runs()
    options = list(past["run_id"]) if len(past) else []
    current = state.current_run_id()
    if current and current not in options:
        options.insert(0, current)
    if not options:
        st.caption("No runs yet: set one up on the Setup page.")
        return
    st.session_state[state.SIDEBAR_RUN] = current if current in options else None
    labels = {row.run_id: services.run_label(row) for row in past.itertuples(index=False)} if len(past) else {}
    st.selectbox(
        "Run",
        options,
        format_func=lambda run_id: labels.get(run_id, run_id),
        key=state.SIDEBAR_RUN,
        on_change=_choose_run,
        placeholder="Open a run…",
        help="Every page shows this run. Runs live in the runs folder; a run keeps everything it committed.",
    )
    if current:
        _sidebar_status(current, poll=poll)


def _sidebar_status(run_id: str, *, poll: bool) -> None:
    ws = services.workspace()
    try:
        progress = ws.progress(run_id)
    except Exception as error:  # a run folder removed or unreadable: say so, keep the app usable
        st.caption(f"Cannot open this run: {format_exception(error)}")
        return
    busy = progress is not None and progress.busy

    @st.fragment(run_every=SIDEBAR_POLL_S if busy and poll else None)
    def card() -> None:
        now = ws.progress(run_id)
        if busy and now is not None and not now.busy:
            st.rerun()  # the work ended: redraw the page with what it committed, and stop polling
        if now is None:
            st.caption("Imported pair set (no engine).")
            return
        status_badge(now)
        if now.busy:
            st.progress(now.fraction, text=progress_text(now))
        elif now.next_phase:
            st.caption(f"Next: round {now.round_index}, {PHASE_LABELS.get(now.next_phase, now.next_phase)}")
        else:
            st.caption("All rounds finished.")

    card()


# -- rounds: live progress -------------------------------------------------------------------------------------


def progress_panel(view: services.RunView, started: Progress) -> None:
    """Live progress of ``view``'s worker: bar with counts, tokens/s, ETA; full rerun when a phase completes."""
    ws = services.workspace()
    run_id = view.run_id

    @st.fragment(run_every=PANEL_POLL_S if started.busy else None)
    def panel() -> None:
        now = ws.progress(run_id) or started
        moved = (now.round_index, now.next_phase, now.busy) != (started.round_index, started.next_phase, started.busy)
        if started.busy and moved:
            st.rerun()  # a phase finished (or the work ended): redraw the timeline, controls and counts
        with st.container(border=True, key=state.ROUNDS_PROGRESS):
            top = st.columns([3, 1, 1, 1], vertical_alignment="center")
            with top[0]:
                status_badge(now)
            top[1].metric("tokens/s", f"{now.tokens_per_second:,.0f}" if now.busy else "–")
            top[2].metric(
                "ETA (phase)",
                eta.text(now.eta()) if now.busy else "–",
                help="From the same phase in earlier rounds and this phase's own rate; '–' until one is known.",
            )
            top[3].metric(
                f"ETA ({now.phases_left} phase{'s' if now.phases_left != 1 else ''} queued)" if now.busy else "ETA",
                eta.text(now.queue_eta()) if now.busy else "–",
                help="Until every queued phase is done, from how long each phase took in this run; known once "
                "each queued phase has run once.",
            )
            if now.busy:
                st.progress(now.fraction, text=progress_text(now))
            elif now.status == "finished":
                st.progress(1.0, text="All rounds finished.")
            else:
                label = PHASE_LABELS.get(now.next_phase or "", now.next_phase)
                st.progress(0.0, text=f"Waiting: next is round {now.round_index} · {label}")
            if now.message and not now.busy:
                st.caption(now.message)

    panel()


def error_panel(view: services.RunView, progress: Progress) -> None:
    """The failure with its cause and where it happened, the traceback, and a way to continue."""
    if progress.status != "error" or not progress.last_error:
        return
    ws = services.workspace()
    with st.container(border=True, key=state.ROUNDS_ERROR):
        st.error(f"**The last phase failed.** {progress.last_error}", icon=":material/error:")
        where = _failure_site(progress.last_traceback)
        if where:
            st.caption(f"Raised at {where}")
        st.caption(
            "Nothing committed is lost: the run is back at its last finished phase "
            f"(round {progress.round_index}, next {PHASE_LABELS.get(progress.next_phase or '', progress.next_phase)})."
            " Fix the cause (a model path, a task file, a device) and retry, or set up a corrected run."
        )
        left, right = st.columns([1, 3])
        if left.button(
            f"Retry {progress.next_phase}", key=state.ROUNDS_RETRY, type="primary", icon=":material/replay:"
        ):
            try:
                ws.start(view.run_id, phase=progress.next_phase)
            except Exception as error:
                st.error(f"{type(error).__name__}: {error}")
            else:
                st.rerun()
        right.page_link(SETUP_PAGE, label="Change the setup", icon=":material/tune:")
        if progress.last_traceback:
            with st.expander("Traceback"):
                st.code(progress.last_traceback, language="text")


def _failure_site(traceback_text: str | None) -> str | None:
    if not traceback_text:
        return None
    lines = [line.strip() for line in traceback_text.splitlines() if line.strip().startswith('File "')]
    return lines[-1] if lines else None


# -- pairs --------------------------------------------------------------------------------------------------

#: The Pairs page's view in its address: the filters, the page of the table and the open pair.
PAIRS_URL_KEYS = (
    UrlKey(state.PAIRS_ROUND, "int"),
    UrlKey(state.PAIRS_SIDE, "text"),
    UrlKey(state.PAIRS_ITEM, "int"),
    UrlKey(state.PAIRS_MIN_GAP, "float"),
    UrlKey(state.PAIRS_MAX_GAP, "float"),
    UrlKey(state.PAIRS_TEXT, "text", ""),
    UrlKey(state.PAIRS_PAGE, "int", 1),
    UrlKey(state.PAIRS_OPEN, "pair"),
)


def pair_filters(rounds: pd.DataFrame, keys: state.PairFilterKeys, *, heading: str | None = None) -> dict[str, Any]:
    """One bordered row of the six pair filters; returns the store's filter keywords, None where a filter is empty.

    ``rounds`` is the store's rounds frame (its ``round`` column gives the choices). The result goes straight to
    ``RunStore.pairs_count`` / ``pairs_page`` and, without the None entries, to an export.
    """
    round_options = [None, *[int(r) for r in rounds["round"]]]
    with st.container(border=True, key=keys.box):
        if heading:
            st.markdown(heading)
        f1, f2, f3, f4, f5, f6 = st.columns([1, 1.6, 0.8, 0.8, 0.8, 1.8])
        chosen_round = f1.selectbox(
            "Round",
            round_options,
            key=keys.round,
            format_func=lambda r: "all" if r is None else f"round {r}",
        )
        side = f2.segmented_control(
            "Winner side",
            ["current", "comparator"],
            key=keys.side,
            help="Which side's joint response won: the current agents or the comparator. None selected = both.",
        )
        item = f3.number_input("Task item", min_value=0, step=1, value=None, key=keys.item, placeholder="any")
        min_gap = f4.number_input(
            "Min gap",
            value=None,
            step=0.05,
            format="%g",
            key=keys.min_gap,
            placeholder="any",
            help="reward_gap = winner_reward - loser_reward",
        )
        max_gap = f5.number_input("Max gap", value=None, step=0.05, format="%g", key=keys.max_gap, placeholder="any")
        text = f6.text_input("Text search", key=keys.text, placeholder="words in a prompt or either response").strip()
    return {
        "round": chosen_round,
        "winner_side": side or None,
        "item": item,
        "min_gap": min_gap,
        "max_gap": max_gap,
        "text": text or None,
    }


def pair_label(row: Any) -> str:
    side = row.winner_side or "?"
    return (
        f"round {int(row.round)} · pair {int(row.pair_index)} · item {_int_or_dash(row.item_index)} · "
        f"{side} won · gap {float(row.reward_gap):.3f}"
    )


def pair_title(detail: dict[str, Any]) -> str:
    """The heading of one opened pair: its round, index and task item."""
    return f"Round {int(detail['round'])} · pair {int(detail['pair_index'])} · item {_int_or_dash(detail.get('item_index'))}"


def _int_or_dash(value: Any) -> str:
    return "–" if value is None or pd.isna(value) else str(int(value))


def pair_view(view: services.RunView, detail: dict[str, Any]) -> None:
    """One pair: rewards, then per agent its prompt and winner vs loser side by side with the differences marked."""
    winner_side = detail.get("winner_side")
    loser_side = {"current": "comparator", "comparator": "current"}.get(winner_side or "")
    cols = st.columns(5)
    cols[0].metric("winner reward", f"{detail['winner_reward']:.4g}")
    cols[1].metric("loser reward", f"{detail['loser_reward']:.4g}")
    cols[2].metric("reward gap", f"{detail['reward_gap']:.4g}")
    cols[3].metric(
        "item mean reward",
        f"{detail['candidate_reward_mean']:.4g}",
        help="candidate_reward_mean: mean reward of the item's candidates",
    )
    with cols[4]:
        st.caption("winner side")
        if winner_side:
            st.badge(winner_side, color="blue" if winner_side == "current" else "orange")
        else:
            st.caption("unknown (imported)")
    raw = detail.get("raw_rewards")
    if raw is not None and len(raw):
        st.caption(
            f"raw_rewards [winner, loser] = {[round(float(x), 4) for x in raw]} · target_raw_reward = "
            f"{_fmt_opt(detail.get('target_raw_reward'))} · comparator_raw_reward = {_fmt_opt(detail.get('comparator_raw_reward'))}"
        )
    winners, losers, prompts = detail["winner_completions"], detail["loser_completions"], detail["prompts"]
    w_tag = f"Winner · {winner_side or '?'} side · candidate {_int_or_dash(detail.get('winner_candidate_index'))}"
    l_tag = f"Loser · {loser_side or '?'} side · candidate {_int_or_dash(detail.get('loser_candidate_index'))}"
    for i, (prompt, win, lose) in enumerate(zip(prompts, winners, losers)):
        with st.container(border=True, key=state.pair_agent_key(i)):
            st.markdown(
                f"**Agent {i + 1}** · words in common: {diff.similarity(win, lose):.0%}", help=diff.SIMILARITY_HELP
            )
            st.html(diff.text_box(diff.plain_html(prompt), label="Prompt"))
            left_html, right_html = diff.diff_html(win, lose)
            left, right = st.columns(2)
            with left, st.container(key=state.pair_agent_key(i, "winner")):
                st.html(diff.text_box(left_html, label=w_tag))
            with right, st.container(key=state.pair_agent_key(i, "loser")):
                st.html(diff.text_box(right_html, label=l_tag))
    st.caption("Green: words only in the winner. Red, struck through: words only in the loser.")


def pair_breakdowns(detail: dict[str, Any]) -> None:
    """Why the winner won, where the task reward explains itself (``reward_details``, a code task's levels): each
    side's summary, reward and, for a program, the joined program the reward ran. Nothing for other rewards."""
    sides = (("winner", detail.get("winner_details")), ("loser", detail.get("loser_details")))
    if all(details is None for _, details in sides):
        return
    st.markdown(
        "**Why the winner won**",
        help="The task reward's breakdown of each candidate, stored beside its reward when it was scored.",
    )
    for col, (part, details) in zip(st.columns(2), sides):
        with col, st.container(border=True, key=state.pair_breakdown_key(part)):
            if details is None:
                st.markdown(f"**{part.capitalize()}**")
                st.caption("No breakdown was stored for this candidate.")
                continue
            st.markdown(f"**{part.capitalize()}** · {frames.breakdown_summary(details)}")
            notes = [f"level reward {float(details['reward']):.4g}"] if _number(details.get("reward")) else []
            if details.get("error"):
                notes.append(f"stopped: {details['error']}")
            if notes:
                st.caption(" · ".join(notes))
            if details.get("program"):
                st.code(details["program"], language="python")
            elif details.get("summary"):  # the other fields are behind the summary; show them as they are
                rest = {k: v for k, v in details.items() if k not in frames.BREAKDOWN_SHOWN}
                st.code(json.dumps(rest, ensure_ascii=False, indent=2), language="json")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _fmt_opt(value: Any) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "null"
    return f"{float(value):.4g}"


def candidates_view(view: services.RunView, detail: dict[str, Any], version: str) -> None:
    """Every candidate of the pair's item with its reward (chart and table)."""
    item = detail.get("item_index")
    if item is None or pd.isna(item):
        st.caption("This pair has no item index (imported), so its item's candidates are unknown.")
        return
    frame = figures.item_candidates(view.run_id, version, int(detail["round"]), int(item))
    if frame.empty:
        st.caption("No candidates were stored for this item (imported pairs keep only the pairs).")
        return
    winner_side = detail.get("winner_side")
    loser_side = {"current": "comparator", "comparator": "current"}.get(winner_side or "")
    winner = (
        (winner_side, int(detail["winner_candidate_index"]))
        if winner_side and _known(detail.get("winner_candidate_index"))
        else None
    )
    loser = (
        (loser_side, int(detail["loser_candidate_index"]))
        if loser_side and _known(detail.get("loser_candidate_index"))
        else None
    )
    fig = figures.candidates_figure(view.run_id, version, int(detail["round"]), int(item), winner, loser)
    st.plotly_chart(fig, key=state.PAIRS_CANDIDATES_CHART)
    table = pd.DataFrame(
        {
            "side": frame["side"],
            "candidate": frame["candidate_index"],
            "reward": frame["reward"],
            "raw reward": frame["raw_reward"],
            "parse": frame["parse_status"],
            **(
                {"why": frames.breakdown_column(frame["details_json"])}
                if "details_json" in frame and frame["details_json"].notna().any()
                else {}
            ),
            **{
                f"agent {i + 1}": [c[i] if i < len(c) else "" for c in frame["completions"]]
                for i in range(_agents(frame))
            },
        }
    )
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        column_config={
            "reward": st.column_config.NumberColumn(format="%.4f"),
            "raw reward": st.column_config.NumberColumn(format="%.4f"),
        },
    )


def _known(value: Any) -> bool:
    return value is not None and not pd.isna(value)


def _agents(frame: pd.DataFrame) -> int:
    return max((len(c) for c in frame["completions"]), default=0)


def record_json(detail: dict[str, Any]) -> str:
    return json.dumps(detail.get("record", {}), ensure_ascii=False, indent=2)


def format_exception(error: BaseException) -> str:
    return "".join(tb.format_exception_only(type(error), error)).strip()
