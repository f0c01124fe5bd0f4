"""Data: export pairs (seed JSON, JSONL, Parquet, CSV, iteration files) with filters; import CoMLRL replay data."""

from pathlib import Path

import streamlit as st

from comlrl_lab.ui import components, navigation, services, state, words

navigation.ensure_router()

ws = services.workspace()

st.title("Data")
st.caption("Export a run's pairs for your own analysis, or import CoMLRL preference data to browse it here.")

export_tab, import_tab = st.tabs(["Export", "Import"], key=state.DATA_TAB)

# -- export --------------------------------------------------------------------------------------------------

with export_tab:
    run_id = state.current_run_id()
    if not run_id or not ws.has_run(run_id):
        st.info("Open a run (Setup page or the sidebar) to export its pairs.", icon=":material/info:")
    else:
        view = ws.view(run_id)
        st.caption(f"Run `{run_id}`. Files are also written to `{view.run_dir / services.EXPORTS_DIR}`.")
        formats = list(services.EXPORT_FORMATS)
        fmt = st.radio(
            "Format",
            formats,
            key=state.EXPORT_FORMAT,
            horizontal=True,
            format_func=lambda f: services.EXPORT_FORMATS[f].label,
            help="JSON and JSONL hold the seed's nine record fields exactly; Parquet and CSV add provenance columns "
            "(round, pair_index, item_index, candidate indices, winner_side, reward_gap). Iteration files are "
            "CoMLRL's iteration_NNNN.json, one per round.",
        )
        rounds = view.store.rounds(run_id)
        filters: dict = {}
        if fmt != services.ROUND_FILES:
            filters = components.pair_filters(rounds, state.EXPORT_FILTERS, heading="**Filters** (empty = all pairs)")
            count = view.store.pairs_count(run_id, **filters)
            st.markdown(f"**{words.counted(count, 'pair')}** will be exported.")
        else:
            st.caption(
                f"Every collected round as one file ({words.counted(len(rounds), 'round')}); filters do not apply."
            )
        if st.button("Build the export", type="primary", icon=":material/build:", key=state.EXPORT_BUILD):
            try:
                path, n = ws.export(run_id, fmt, {k: v for k, v in filters.items() if v is not None})
            except Exception as error:
                st.error(components.format_exception(error))
            else:
                st.session_state[state.EXPORT_RESULT] = {"path": str(path), "count": n, "format": fmt, "run_id": run_id}
        result = st.session_state.get(state.EXPORT_RESULT)
        if result and result.get("run_id") == run_id and Path(result["path"]).is_file():
            path = Path(result["path"])
            what = "round files" if result["format"] == services.ROUND_FILES else "pairs"
            with st.container(border=True, key=state.EXPORT_RESULT_BOX):
                st.success(
                    f"Built `{path.name}`: {result['count']:,} {what}, {path.stat().st_size:,} bytes.",
                    icon=":material/check_circle:",
                )
                st.download_button(
                    f"Download {path.name}",
                    data=path.read_bytes(),
                    file_name=path.name,
                    mime=services.EXPORT_FORMATS[result["format"]].mime,
                    on_click="ignore",
                    type="primary",
                    icon=":material/download:",
                    key=state.EXPORT_DOWNLOAD,
                )
                st.caption(f"Written to `{path}`")

# -- import --------------------------------------------------------------------------------------------------

with import_tab:
    st.caption(
        "Each import becomes a pair set of its own in the runs folder: browse it on the Pairs, Replay and Data pages. "
        "Every file is checked before anything is written; a malformed file is skipped with the reason."
    )
    left, right = st.columns(2)
    report = None
    with left, st.container(border=True, key=state.IMPORT_DIR_BOX):
        st.markdown("**A CoMLRL `preference_replay` directory**")
        directory = st.text_input("Directory", key=state.IMPORT_DIR, placeholder="/path/to/output/preference_replay")
        if st.button(
            "Import the directory",
            key=state.IMPORT_DIR_BUTTON,
            icon=":material/drive_folder_upload:",
            disabled=not directory.strip(),
        ):
            try:
                report = ws.import_replay_dir(directory.strip())
            except Exception as error:
                st.error(components.format_exception(error))
    with right, st.container(border=True, key=state.IMPORT_FILES_BOX):
        st.markdown("**Uploaded pair files**")
        uploads = st.file_uploader(
            "iteration_NNNN.json, a JSON list of records, or JSONL",
            type=["json", "jsonl"],
            accept_multiple_files=True,
            key=state.IMPORT_FILES,
        )
        if st.button(
            "Import the files", key=state.IMPORT_FILES_BUTTON, icon=":material/upload_file:", disabled=not uploads
        ):
            try:
                report = ws.import_files(list(uploads))
            except Exception as error:
                st.error(components.format_exception(error))
    if report is not None:
        st.session_state[state.IMPORT_RESULT] = {
            "run_id": report.run_id if report.imported_files else None,
            "files": report.imported_files,
            "skipped": report.skipped,
            "ignored": report.ignored,
            "pairs": report.pairs,
            "rounds": report.rounds,
        }
    result = st.session_state.get(state.IMPORT_RESULT)
    if result:
        with st.container(border=True, key=state.IMPORT_RESULT_BOX):
            if result["run_id"]:
                st.success(
                    f"Imported {words.counted(result['pairs'], 'pair')} from {words.counted(len(result['files']), 'file')} into `{result['run_id']}` "
                    f"(rounds {', '.join(map(str, result['rounds']))}).",
                    icon=":material/check_circle:",
                )
                if st.button("Browse these pairs", key=state.IMPORT_OPEN, type="primary", icon=":material/compare:"):
                    state.set_current_run(result["run_id"])
                    st.session_state.pop(state.IMPORT_RESULT, None)
                    state.switch_page(navigation.PAIRS_PAGE)
            else:
                st.error("Nothing was imported.")
            for name, reason in result["skipped"]:
                st.warning(f"Skipped `{name}`: {reason}", icon=":material/warning:")
            for name, reason in result.get("ignored", []):
                st.info(f"Ignored `{name}`: {reason}", icon=":material/info:")
