"""Pairs: browse by round, item, winner side, reward gap and text; winner vs loser per agent; read-only SQL; label
blinded comparisons and read agreement (runs whose preferences come from people or a judge)."""

import pandas as pd
import streamlit as st

from comlrl_lab.ui import components, figures, frames, labelling, navigation, services, state, url_state, words

navigation.ensure_router()

view = components.require_run("Create, open or import a run to read its preference pairs.")
store, run_id = view.store, view.run_id
labelled = view.spec is not None and view.spec.round_phases() != frames.PHASES

st.title("Pairs")
st.caption(
    f"Run `{run_id}`. Each pair is two joint responses to one task item that the oracle scored differently: "
    "the winner (higher reward) and the loser. In iterative training one side is the current agents, the other the comparator."
    + (
        " In this run people or a judge decide: collect's pairs are comparisons (reward ties kept), and the pairs "
        "trained on are the sides their labels prefer (Label tab)."
        if labelled
        else ""
    )
)

PAGE_SIZE = 25
SQL_MAX_ROWS = 100_000
DEFAULT_SQL = (
    "SELECT round, winner_side, count(*) AS pairs, round(avg(reward_gap), 4) AS mean_gap,\n"
    "       round(avg(winner_reward), 4) AS mean_winner_reward\n"
    "FROM pairs\nGROUP BY ALL\nORDER BY ALL"
)

tabs = st.tabs(["Label", "Browse pairs", "SQL"] if labelled else ["Browse pairs", "SQL"], key=state.PAIRS_TAB)
browse, sql = tabs[-2:]


def browse_pairs() -> None:
    rounds = store.rounds(run_id)
    read, notes = url_state.restore("pairs", components.PAIRS_URL_KEYS)
    notes += [n for n in [url_state.drop_unknown(state.PAIRS_ROUND, [None, *map(int, rounds["round"])])] if n]
    for note in notes:
        st.caption(note)
    filters = components.pair_filters(rounds, state.PAIRS_FILTERS)
    total = store.pairs_count(run_id, **filters)
    pages = max(1, -(-total // PAGE_SIZE))
    if state.PAIRS_OPEN in read and state.PAIRS_PAGE not in read:
        # A link with the pair but not its page (typed by hand): open the page the pair is on under the filters.
        position = store.pair_position(run_id, st.session_state[state.PAIRS_OPEN], **filters)
        if position is None:
            wanted = st.session_state[state.PAIRS_OPEN]
            st.caption(
                f"pairs.open={wanted[0]}:{wanted[1]} in the address is not among these pairs; the first is open."
            )
        else:
            st.session_state[state.PAIRS_PAGE] = position // PAGE_SIZE + 1
    if st.session_state.get(state.PAIRS_PAGE, 1) > pages:
        st.session_state[state.PAIRS_PAGE] = 1
    # The page box stays clear of the right edge, where the table's toolbar appears on hover.
    count_col, page_col, _ = st.columns([2, 1, 1], vertical_alignment="bottom")
    page = page_col.number_input(f"Page (of {pages})", min_value=1, max_value=pages, step=1, key=state.PAIRS_PAGE)
    count_col.markdown(
        f"**{words.counted(total, 'pair')}** {words.agrees(total, 'matches', 'match')}"
        + (f" · showing {PAGE_SIZE * (page - 1) + 1}–{min(total, PAGE_SIZE * page)}" if total else "")
    )
    frame = store.pairs_page(run_id, limit=PAGE_SIZE, offset=PAGE_SIZE * (int(page) - 1), **filters)
    url_state.keep(components.PAIRS_URL_KEYS)

    if frame.empty:
        st.info(
            "No pair matches these filters."
            if total == 0 and len(rounds)
            else "This run has no pairs yet: run a Collect phase on the Rounds page."
        )
        return

    labels = [components.pair_label(row) for row in frame.itertuples(index=False)]
    keys = [(int(r), int(p)) for r, p in zip(frame["round"], frame["pair_index"])]

    def _table_selected() -> None:
        rows = st.session_state[state.PAIRS_TABLE].selection.rows
        if rows:
            st.session_state[state.PAIRS_OPEN] = keys[rows[0]]

    table = pd.DataFrame(
        {
            "round": frame["round"],
            "pair": frame["pair_index"],
            "item": frame["item_index"],
            "winner side": frame["winner_side"],
            "winner reward": frame["winner_reward"],
            "loser reward": frame["loser_reward"],
            "gap": frame["reward_gap"],
            "agent 1 winner": [c[0] if len(c) else "" for c in frame["winner_completions"]],
            "agent 1 loser": [c[0] if len(c) else "" for c in frame["loser_completions"]],
        }
    )
    st.dataframe(
        table,
        hide_index=True,
        width="stretch",
        height=min(38 + 35 * len(table), 420),
        key=state.PAIRS_TABLE,
        on_select=_table_selected,
        selection_mode="single-row",
        column_config={
            "winner reward": st.column_config.NumberColumn(format="%.4f"),
            "loser reward": st.column_config.NumberColumn(format="%.4f"),
            "gap": st.column_config.ProgressColumn(
                format="%.3f", min_value=0.0, max_value=max(1e-9, float(frame["reward_gap"].max()))
            ),
        },
    )
    if st.session_state.get(state.PAIRS_OPEN) not in keys:
        st.session_state[state.PAIRS_OPEN] = keys[0]
    chosen = st.selectbox(
        "Open pair",
        keys,
        key=state.PAIRS_OPEN,
        format_func=lambda k: labels[keys.index(k)],
        help="Or click a row of the table.",
    )
    url_state.keep(components.PAIRS_URL_KEYS)

    detail = store.pair_detail(run_id, chosen[0], chosen[1])
    if detail is None:
        st.warning("That pair is no longer in the store.")
        return
    st.subheader(components.pair_title(detail))
    components.pair_view(view, detail)
    components.pair_breakdowns(detail)
    with st.expander("Every candidate of this item, with its reward", expanded=True):
        components.candidates_view(view, detail, figures.data_version(rounds))
    with st.expander("The pair as a seed JSON record"):
        st.code(components.record_json(detail), language="json")


if labelled:
    with tabs[0]:
        labelling.label_tab(view, services.workspace().progress(run_id))

with browse:
    browse_pairs()

with sql:
    st.caption(
        "Read-only SQL over this run's DuckDB file. Tables: runs, rounds, phases, candidates, pairs, replay, metrics, "
        "events, reward_distributions, labels; view pair_records (the seed's record fields). Statements that could "
        "write are refused."
    )
    if state.SQL_QUERY not in st.session_state:
        st.session_state[state.SQL_QUERY] = DEFAULT_SQL
    st.text_area("Query", key=state.SQL_QUERY, height=140)
    run_col, limit_col = st.columns([1, 1], vertical_alignment="bottom")
    # No min_value/max_value: the browser would drop a value past them (a red outline) and run the old limit.
    limit = limit_col.number_input("Row limit", value=1000, step=100, key=state.SQL_LIMIT)
    if run_col.button("Run query", type="primary", icon=":material/play_arrow:", key=state.SQL_RUN):
        st.session_state[state.SQL_SUBMITTED] = st.session_state[state.SQL_QUERY]
    submitted = st.session_state.get(state.SQL_SUBMITTED)
    if submitted is not None and not (1 <= int(limit or 0) <= SQL_MAX_ROWS):
        st.error(
            f"Refused: the row limit must be between 1 and {SQL_MAX_ROWS:,}, not {limit}.", icon=":material/block:"
        )
    elif submitted is not None:  # an empty query too: the store refuses it in words
        try:
            result = store.readonly_sql(submitted, limit=int(limit))
        except services.ReadOnlyQueryError as error:
            st.error(f"Refused: {error}", icon=":material/block:")
        except services.QueryExecutionError as error:
            st.error(f"The query failed: {error}", icon=":material/error:")
        else:
            st.caption(f"{len(result):,} rows" + (" (row limit reached)" if len(result) >= int(limit) else ""))
            st.dataframe(result, hide_index=True, width="stretch", key=state.SQL_RESULT)
            st.download_button(
                "Download CSV",
                data=services.dataframe_csv(result),
                file_name=f"{run_id}-query.csv",
                mime="text/csv",
                on_click="ignore",
                icon=":material/download:",
                key=state.SQL_DOWNLOAD,
            )
