"""Compare: runs side by side, grouped over seeds: curves as mean ± 95% CI, the settings that differ, pair statistics."""

import streamlit as st

from comlrl_lab.ui import compare, navigation, services, state, sweeps, url_state, words

navigation.ensure_router()

MAX_DEFAULT_RUNS = 40

st.title("Compare runs")
st.caption(
    "Runs are read from the Parquet snapshots each run writes after every phase, so a running run can be compared "
    "as it fills in. Runs whose settings differ only in `seed` (or in their number of rounds) form one group; its "
    "numbers and curves are the mean over its seeds with a 95% confidence interval (Student's t). A run with the "
    "settings and seed of another counts once, and a run that never committed a phase is left out."
)

root = services.workspace().root
entries = compare.cached_catalogue(root)
# Before the filters: starting or opening a sweep sets the tag filter to it.
sweeps.grid_panel(entries)
sweeps.sweep_picker()
if not entries:
    st.info("No runs yet: create one on the Setup page, or run `comlrl-lab sweep` into this runs folder.")
    st.stop()

restored, url_notes = url_state.restore("compare", compare.URL_KEYS)
url_notes += [
    note for key in compare.URL_FILTERS if (note := url_state.drop_unknown(key, compare.filter_options(entries, key)))
]

left, middle, right = st.columns(3)
algorithms = left.multiselect(
    "Algorithm", compare.filter_options(entries, state.COMPARE_ALGORITHMS), key=state.COMPARE_ALGORITHMS
)
tasks = middle.multiselect("Task", compare.filter_options(entries, state.COMPARE_TASKS), key=state.COMPARE_TASKS)
tags = right.multiselect(
    "Tag",
    # A sweep that has only just started has no run yet, but the filter already names it.
    sorted(
        set(compare.filter_options(entries, state.COMPARE_TAGS)) | set(st.session_state.get(state.COMPARE_TAGS, []))
    ),
    key=state.COMPARE_TAGS,
    help="A sweep tags each of its runs with its id.",
)
matching = compare.filter_runs(entries, algorithms=algorithms, tasks=tasks, tags=tags)
options = [e.run_id for e in matching]
filters = (tuple(algorithms), tuple(tasks), tuple(tags), tuple(options))
if state.COMPARE_RUNS in restored:
    st.session_state[state.COMPARE_FILTERS_SEEN] = filters  # the address names the runs: they stand
if st.session_state.get(state.COMPARE_FILTERS_SEEN) != filters or state.COMPARE_RUNS not in st.session_state:
    # New filters, or a new run that they match (a sweep filling in), choose every matching run; until then the
    # user's own picks stand.
    st.session_state[state.COMPARE_RUNS] = options[:MAX_DEFAULT_RUNS]
    st.session_state[state.COMPARE_FILTERS_SEEN] = filters
else:
    st.session_state[state.COMPARE_RUNS] = [r for r in st.session_state[state.COMPARE_RUNS] if r in options]
chosen = st.multiselect("Runs", options, key=state.COMPARE_RUNS, placeholder="Pick runs to compare")
with st.expander(
    f"{words.counted(len(matching), 'run')} {words.agrees(len(matching), 'matches', 'match')} the filters"
):
    st.dataframe(compare.catalogue_frame(matching), key=state.COMPARE_RUNS_TABLE, hide_index=True)

left, right = st.columns(2)
st.session_state.setdefault(state.COMPARE_BY_SEED, True)
by_seed = left.toggle("Group runs that differ only in seed", key=state.COMPARE_BY_SEED)
st.session_state.setdefault(state.COMPARE_SMOOTHING, 1)
smoothing = right.slider(
    "Smoothing",
    min_value=1,
    max_value=5,
    key=state.COMPARE_SMOOTHING,
    help="Each run's curve becomes a trailing moving average over this many rounds before the mean over seeds.",
)
url_state.keep(compare.url_keys(default_runs=options[:MAX_DEFAULT_RUNS]))
for note in url_notes:
    st.caption(note)
if not chosen:
    st.info("Pick at least one run.")
    st.stop()

by_id = {e.run_id: e for e in matching}
data = compare.cached_compare(root, [by_id[r] for r in chosen], by_seed=by_seed, smoothing=smoothing)
if data.unreadable:
    st.warning(
        "Left out, not Parquet any more: "
        + ", ".join(f"`{path}`" for path in data.unreadable)
        + ". Open the run (Setup) or resume it to write its snapshots again.",
        icon=":material/broken_image:",
    )
for line in compare.left_out_lines(data):
    st.caption(line)
if not data.groups:
    st.info("None of the chosen runs has committed a phase yet: they appear here as their phases finish.")
    st.stop()

st.subheader("Groups")
st.dataframe(
    compare.groups_frame(data),
    key=state.COMPARE_GROUPS_TABLE,
    hide_index=True,
    column_config={"settings that differ": st.column_config.TextColumn(width="large")},
)

st.subheader("Evaluation reward: final and best")
if data.outcomes.empty:
    st.caption("No group has an evaluation from all its runs yet.")
else:
    st.caption(
        "Mean over each group's runs ± the half-width of its 95% confidence interval (Student's t over n runs). "
        "Final: at the last round all the group's runs reached. Best: each run's highest round up to then, which "
        "favours noisy groups (the maximum of noisy values is biased upward)."
    )
    st.dataframe(compare.outcomes_display(data.outcomes), key=state.COMPARE_OUTCOMES_TABLE, hide_index=True)
    if len(data.groups) >= 2:
        names = [g.name for g in data.groups]
        url_notes = [
            n for key in (state.COMPARE_DIFF_A, state.COMPARE_DIFF_B) if (n := url_state.drop_unknown(key, names))
        ]
        st.session_state.setdefault(state.COMPARE_DIFF_A, names[0])
        st.session_state.setdefault(state.COMPARE_DIFF_B, names[1])
        first_col, second_col, answer_col = st.columns([1, 1, 3], vertical_alignment="bottom")
        first = first_col.selectbox("Group", names, key=state.COMPARE_DIFF_A)
        second = second_col.selectbox("minus group", names, key=state.COMPARE_DIFF_B)
        url_state.keep(compare.url_keys(default_runs=options[:MAX_DEFAULT_RUNS]))
        with answer_col:
            st.markdown(compare.difference_text(data, first, second))

st.subheader("Curves per round")
for line in (*data.cuts, *data.band_notes):
    st.caption(line)
if data.curves_figure is None:
    st.info("The chosen runs have no snapshot metrics yet: they appear as phases finish.")
else:
    st.plotly_chart(data.curves_figure, key=state.COMPARE_CURVES_CHART)

st.subheader("Settings that differ")
if len(data.groups) < 2:
    st.caption("One group: there is nothing to tell apart.")
elif data.config_diff.empty:
    st.caption("The groups share every setting.")
else:
    st.dataframe(data.config_diff, key=state.COMPARE_DIFF_TABLE)

st.subheader("Pair statistics")
st.caption("Groups by their names in the table above; hover a bar or box for its settings.")
st.dataframe(
    data.pair_table.drop(columns="settings"),
    key=state.COMPARE_PAIRS_TABLE,
    hide_index=True,
    column_config={
        "current wins": st.column_config.NumberColumn(format="percent"),
        "pairs per round": st.column_config.NumberColumn(format="%.1f"),
        "gap mean": st.column_config.NumberColumn(format="%.3f"),
        "gap median": st.column_config.NumberColumn(format="%.3f"),
        "winner tokens": st.column_config.NumberColumn(format="%.1f"),
        "loser tokens": st.column_config.NumberColumn(format="%.1f"),
    },
)
left, right = st.columns(2)
if data.gaps_figure is not None:
    left.plotly_chart(data.gaps_figure, key=state.COMPARE_GAPS_CHART)
if data.sides_figure is not None:
    right.plotly_chart(data.sides_figure, key=state.COMPARE_SIDES_CHART)
