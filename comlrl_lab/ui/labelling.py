"""The Pairs page's Label tab: people's verdicts on a round's blinded comparisons, and how far labels agree.

One comparison at a time, its two joint responses shown as A and B in the order collect recorded (``a_side``); the
side each came from (the reward function's winner or loser, current agents or comparator) is told only after the
verdict. Each verdict is written to the store as it is given (``RunStore.put_labels``), so closing the tab or
killing the server loses at most the one being clicked; undo deletes the labeller's last one. Keys 1 2 3 4 give
the four verdicts, s skips and u undoes: a script in the page clicks the matching button, so a key press and a
click run the same callback. Agreement (labellers against the reward function and each other) is computed from
the stored comparisons and labels with ``data.labels.agreement``, the same figures the label phase records.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import streamlit as st

from comlrl_lab.data.labels import VERDICTS, Agreement, Label, agreement, group_labels, joint_text, shown_sides
from comlrl_lab.data.records import PreferencePair
from comlrl_lab.engine.manager import Progress
from comlrl_lab.names import metric_names
from comlrl_lab.ui import services, state, words

#: Keyboard key -> (verdict given, or "skip" / "undo"; the button's text). The buttons are keyed by their key.
SHORTCUTS: dict[str, tuple[str, str]] = {
    "1": ("A", "A is better"),
    "2": ("B", "B is better"),
    "3": ("tie", "Tie"),
    "4": ("both_bad", "Both bad"),
    "s": ("skip", "Skip"),
    "u": ("undo", "Undo last"),
}

# Runs in the page itself (st.html with JavaScript allowed), once per browser tab: a key press outside a text box
# clicks the enabled button keyed for it, which does what a click does. No button, no effect (other pages).
KEYS_SCRIPT = """
<script>
(function () {
  if (window.__comlrlLabelKeys) { return; }
  window.__comlrlLabelKeys = true;
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey || event.repeat) { return; }
    var target = event.target;
    if (target && (target.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(target.tagName))) { return; }
    var key = (event.key || "").toLowerCase();
    if (!/^[1-4su]$/.test(key)) { return; }
    var button = document.querySelector(".st-key-PREFIX" + key + " button");
    if (!button || button.disabled) { return; }
    event.preventDefault();
    button.click();
  });
})();
</script>
""".replace("PREFIX", state.label_key("").replace(".", "-"))


# Moves the focus out of the name box onto the comparison (made focusable), so the first key after the name is a
# verdict, not text: after Enter the browser leaves the focus in the box, where "1" turned "walker" into "walker1".
# NONCE makes each copy new, so Streamlit draws (and runs) it again each time the name changes.
FOCUS_SCRIPT = """
<script>
(function () {
  var tries = 0;
  function move() {
    var box = document.querySelector(".st-key-COMPARISON");
    if (!box) { if (tries++ < 20) { setTimeout(move, 50); } return; }
    if (document.activeElement && document.activeElement !== document.body) { document.activeElement.blur(); }
    box.setAttribute("tabindex", "-1");
    box.focus({preventScroll: true});
  }
  move();
})();
/* NONCE */
</script>
""".replace("COMPARISON", state.LABEL_COMPARISON.replace(".", "-"))


@dataclass(frozen=True)
class Queue:
    """Where one labeller stands in a round: what is left for them, and the round's progress."""

    todo: list[int]  # pair indices still needing this labeller's verdict, skipped ones excluded, in order
    skipped: list[int]  # of those, the ones this session skipped
    complete: int  # comparisons that have all the labels they need
    total: int
    mine: int  # comparisons this labeller has labelled


def queue(total: int, round_index: int, labels: Sequence[Label], needed: int, labeller: str, skipped: set) -> Queue:
    """The comparisons of round ``round_index`` (``0..total-1``) that still need ``labeller``: fewer than ``needed``
    labels and none of theirs; ``skipped`` holds (round, pair_index) keys this session skipped."""
    grouped = group_labels(label for label in labels if label.round == round_index)
    open_ = [
        i
        for i in range(total)
        if len(grouped.get((round_index, i), ())) < needed
        and all(label.labeller != labeller for label in grouped.get((round_index, i), ()))
    ]
    return Queue(
        todo=[i for i in open_ if (round_index, i) not in skipped],
        skipped=[i for i in open_ if (round_index, i) in skipped],
        complete=sum(len(grouped.get((round_index, i), ())) >= needed for i in range(total)),
        total=total,
        mine=sum(any(label.labeller == labeller for label in grouped.get((round_index, i), ())) for i in range(total)),
    )


def reveal(comparison: PreferencePair, label: Label) -> str:
    """What the verdict is told afterwards: where A and B came from and what the reward function gave each."""
    a_is_winner = label.a_side == "winner"
    parts = []
    for name, stored in (("A", "winner" if a_is_winner else "loser"), ("B", "loser" if a_is_winner else "winner")):
        reward = comparison.winner_reward if stored == "winner" else comparison.loser_reward
        origin = comparison.winner_side if stored == "winner" else _other(comparison.winner_side)
        parts.append(f"{name} was {'the ' + origin + ' side, ' if origin else ''}reward {float(reward):.4g}")
    said = dict(SHORTCUTS.values()).get(label.verdict, label.verdict)
    return f"Comparison {label.pair_index + 1}: you said “{said}”. " + "; ".join(parts) + "."


def _other(side: str | None) -> str | None:
    return {"current": "comparator", "comparator": "current"}.get(side or "")


# -- the view ---------------------------------------------------------------------------------------------------


def label_tab(view: services.RunView, progress: Progress | None) -> None:
    """The Label tab of a run whose preferences come from people or a judge."""
    config = view.spec.validated_config()
    store, run_id = view.store, view.run_id
    if config.preference_source == "human":
        if progress is not None and progress.next_phase == "label" and not progress.busy:
            _label_round(view, progress, config)
        else:
            st.info(
                "No round waits for labels now: the labelling view opens when a round's collect phase has run and "
                "its label phase is next (Rounds page).",
                icon=":material/how_to_vote:",
            )
    else:
        st.caption(
            f"The judge model `{config.judge_api_model or config.judge_api_url}` labels this run's comparisons in each "
            "round's label phase, asked in both orders; a verdict is kept only when both orders agree."
        )
        _judge_counts(store, run_id)
    agreement_panel(store, run_id, int(getattr(config, "labels_per_comparison", 1)))


def _label_round(view: services.RunView, progress: Progress, config: Any) -> None:
    store, run_id, round_index = view.store, view.run_id, progress.round_index
    st.html(KEYS_SCRIPT, unsafe_allow_javascript=True)
    with st.container(border=True, key=state.LABEL_GUIDELINE):
        st.markdown("**Guideline**")
        st.markdown(config.label_guideline)
    labeller = st.text_input(
        "Your name (labeller)",
        key=state.LABEL_LABELLER,
        max_chars=80,
        help="Stored with each verdict, so several people's labels can be told apart and compared.",
        on_change=lambda: st.session_state.__setitem__(state.LABEL_FOCUS, True),
    ).strip()
    take_focus = st.session_state.pop(state.LABEL_FOCUS, False)
    comparisons = store.load_pairs(run_id, round=round_index)
    needed = int(config.labels_per_comparison)
    skipped = st.session_state.setdefault(state.LABEL_SKIPPED, set())
    labels = store.labels(run_id, round_index)
    where = queue(len(comparisons), round_index, labels, needed, labeller, skipped)
    last = st.session_state.get(state.LABEL_LAST)
    if last is not None:
        st.caption(last)
    st.progress(
        where.complete / where.total if where.total else 1.0,
        text=f"{where.complete} of {where.total} comparisons of round {round_index} labelled"
        + (f" · {where.mine} by {labeller}" if labeller else ""),
    )
    history = st.session_state.setdefault(state.LABEL_HISTORY, [])
    if where.complete == where.total:
        _go_on(view, round_index, where.total)
        _undo_button(store, run_id, history)
        return
    if not labeller:
        st.info("Type your name to start labelling.", icon=":material/person:")
        return
    if not where.todo:
        if where.skipped:
            st.info(f"You skipped {words.counted(len(where.skipped), 'comparison')} and labelled the rest.")
            st.button("Back to the skipped ones", key=state.LABEL_UNSKIP, on_click=skipped.clear)
        else:
            st.info(
                f"You have labelled every comparison you can; {where.total - where.complete} still need labels from "
                f"others ({needed} each)."
            )
        _undo_button(store, run_id, history)
        return
    index = where.todo[0]
    comparison = comparisons[index]
    a_side = comparison.extra.get("a_side", "winner")
    with st.container(key=state.LABEL_COMPARISON):
        st.markdown(f"**Comparison {index + 1} of {where.total}** · item {comparison.item_index}")
        prompts = list(dict.fromkeys(comparison.prompts))
        with st.container(border=True):
            st.caption("Prompt" if len(prompts) == 1 else "Prompts")
            st.text(joint_text(prompts) if len(prompts) > 1 else prompts[0])
        shown_a, shown_b = shown_sides(comparison)
        for column, name, parts in zip(st.columns(2), ("A", "B"), (shown_a, shown_b)):
            with column.container(border=True, key=state.label_side_key(name)):
                st.markdown(f"**{name}**")
                for agent, text in enumerate(parts):
                    if len(parts) > 1:
                        st.caption(f"Agent {agent + 1}")
                    st.code(text or " ", language=None, wrap_lines=True)

    def give(verdict: str) -> None:
        label = Label(round_index, index, labeller, verdict, a_side)
        store.put_labels(run_id, [label])
        if not history or history[-1][:3] != (round_index, index, labeller):
            history.append((round_index, index, labeller))
        st.session_state[state.LABEL_LAST] = reveal(comparison, label)

    def skip() -> None:
        skipped.add((round_index, index))
        st.session_state[state.LABEL_LAST] = f"Comparison {index + 1} skipped."

    buttons = st.columns(len(SHORTCUTS))
    for column, (key, (action, text)) in zip(buttons, SHORTCUTS.items()):
        if action == "undo":
            with column:
                _undo_button(store, run_id, history)
            continue
        column.button(
            f"{text}  [{key}]",
            key=state.label_key(key),
            type="primary" if action in VERDICTS[:2] else "secondary",
            width="stretch",
            on_click=skip if action == "skip" else give,
            args=() if action == "skip" else (action,),
        )
    st.caption("Keys: 1 A better · 2 B better · 3 tie · 4 both bad · s skip · u undo the last verdict.")
    if take_focus:
        st.html(FOCUS_SCRIPT.replace("NONCE", str(time.time_ns())), unsafe_allow_javascript=True)


def _undo_button(store, run_id: str, history: list) -> None:
    def undo() -> None:
        round_index, index, labeller = history.pop()
        store.delete_label(run_id, round_index, index, labeller)
        st.session_state[state.LABEL_LAST] = f"Verdict on comparison {index + 1} undone."

    st.button(
        f"{SHORTCUTS['u'][1]}  [u]",
        key=state.label_key("u"),
        disabled=not history,
        width="stretch",
        on_click=undo,
        help="Delete your last verdict of this session and show its comparison again.",
    )


def _go_on(view: services.RunView, round_index: int, total: int) -> None:
    st.success(f"All {total} comparisons of round {round_index} have their labels.", icon=":material/check_circle:")

    def go_on() -> None:
        try:
            services.workspace().start(view.run_id, rounds=1)
        except Exception as error:  # shown, not raised: the labels are already stored
            st.session_state[state.LABEL_LAST] = f"Could not go on: {error}"

    st.button(
        f"Go on: finish round {round_index} (label → select → train → evaluate)",
        key=state.LABEL_GO_ON,
        type="primary",
        icon=":material/play_arrow:",
        on_click=go_on,
    )


# -- agreement --------------------------------------------------------------------------------------------------


def _judge_counts(store, run_id: str) -> None:
    metrics = store.metrics(run_id, names=["label/judge"])
    if metrics.empty:
        st.caption("The judge has not labelled a round yet.")
        return
    totals = metrics.groupby("name")["value"].sum()
    cols = st.columns(3)
    for col, (name, text) in zip(
        cols,
        (
            (metric_names.JUDGE_VERDICTS, "verdicts kept"),
            (metric_names.JUDGE_INCONSISTENT, "dropped: orders disagree"),
            (metric_names.JUDGE_UNPARSEABLE, "dropped: unparseable"),
        ),
    ):
        col.metric(text, int(totals.get(name, 0)))


def agreement_frame(
    store: services.RunStore, run_id: str, labels: Sequence[Label], raters: int
) -> tuple[Agreement, pd.DataFrame]:
    """(``data.labels.Agreement`` over every stored label, one row per labeller against the reward function)."""
    comparisons = {}
    for round_index in sorted({label.round for label in labels}):
        for index, pair in enumerate(store.load_pairs(run_id, round=round_index)):
            comparisons[(round_index, index)] = pair
    found = agreement(comparisons, labels, raters)
    rows = pd.DataFrame(
        [
            {"labeller": name, "labels": count, "Cohen's κ vs reward": kappa, "% agreement with reward": percent}
            for name, (count, kappa, percent) in found.per_labeller.items()
        ],
        columns=["labeller", "labels", "Cohen's κ vs reward", "% agreement with reward"],
    )
    return found, rows


def agreement_panel(store, run_id: str, raters: int) -> None:
    labels = store.labels(run_id)
    st.subheader("Agreement")
    if not labels:
        st.caption("No labels yet.")
        return
    found, rows = agreement_frame(store, run_id, labels, raters)
    cols = st.columns(4)
    cols[0].metric("labels", found.labels)
    cols[1].metric("labellers", found.labellers)
    cols[2].metric("Cohen's κ vs reward", _fmt(found.vs_reward_kappa))
    cols[3].metric("% agreement with reward", _fmt(found.vs_reward_percent, "{:.0f}%"))
    if found.labellers >= 2:
        between = st.columns(2)
        between[0].metric("Fleiss' κ between labellers", _fmt(found.between_fleiss))
        between[1].metric("Krippendorff's α between labellers", _fmt(found.between_alpha))
    st.dataframe(
        rows,
        hide_index=True,
        width="stretch",
        key=state.LABEL_AGREEMENT_TABLE,
        column_config={
            "Cohen's κ vs reward": st.column_config.NumberColumn(format="%.3f"),
            "% agreement with reward": st.column_config.NumberColumn(format="%.1f"),
        },
    )
    st.caption(
        "A verdict counts as the side it prefers, or as none (tie, both bad); the reward function prefers the side "
        "with the higher reward, none on a tie. κ is undefined (—) when every answer falls in one category."
    )


def _fmt(value: float, pattern: str = "{:.3f}") -> str:
    return "—" if value is None or math.isnan(value) else pattern.format(value)
