"""Setup: agents, task, algorithm, comparator, replay buffer and every config field; create, save, load, reopen."""

import json

import streamlit as st

from comlrl_lab.ui import charts, components, draft, forms, frames, model_picker, navigation, services, state

navigation.ensure_router()

ws = services.workspace()

st.title("Set up an experiment")
st.caption(
    "Pick the agents' models, a task and an algorithm; every config field below comes from the config classes, "
    "with CoMLRL's names, defaults and help (hover the ? beside a field). The config is checked as you type, exactly as the "
    "Python API checks it."
)

started, draft_notes = draft.start_session() or (None, [])
if started == "preset":
    st.session_state[state.SETUP_NOTICE] = (
        "info",
        "The form starts from the quickstart preset (`examples/quickstart.yaml`): MADPOIter on the embedded model, "
        "sized to learn visibly in a few CPU minutes, with the opt-in MADPO stabilisers on. Every field can be "
        "changed; CoMLRL's default is in each field's tooltip.",
    )
elif started == "draft":
    st.session_state[state.SETUP_NOTICE] = (
        "info",
        "Your unsaved setup came back from the page's address: the quickstart preset with your changes"
        + (". Skipped: " + "; ".join(draft_notes) if draft_notes else "."),
    )
notice = st.session_state.pop(state.SETUP_NOTICE, None)
if notice:
    kind, text = notice
    getattr(st, kind)(text)


# -- reopen a past run / load a config file -------------------------------------------------------------------


def _open_past() -> None:
    path = st.session_state.get(state.SETUP_PAST)
    if not path:
        return
    try:
        run_id = ws.open_dir(path)
    except Exception as error:
        st.session_state[state.SETUP_NOTICE] = ("error", f"Could not open {path}: {components.format_exception(error)}")
        return
    state.set_current_run(run_id)
    st.session_state[state.SETUP_GO_ROUNDS] = True


def _copy_past() -> None:
    path = st.session_state.get(state.SETUP_PAST)
    if not path:
        return
    try:
        spec = services.ExperimentSpec.load(f"{path}/spec.json")
    except Exception as error:
        st.session_state[state.SETUP_NOTICE] = (
            "error",
            f"{path} has no readable spec: {components.format_exception(error)}",
        )
        return
    notes = forms.load_spec_into_state(spec)
    st.session_state[state.SETUP_NOTICE] = (
        "success",
        "Loaded the setup of " + path + (". " + "; ".join(notes) if notes else "."),
    )


def _load_file() -> None:
    uploaded = st.session_state.get(state.SETUP_LOAD_FILE)
    if uploaded is None:
        st.session_state[state.SETUP_NOTICE] = ("warning", "Choose a config file first.")
        return
    # A bare config (CoMLRL field names) is read for the algorithm chosen now.
    algorithm = forms.algorithm_name(
        st.session_state.get(state.SETUP_FAMILY, forms.base_setup_value(state.SETUP_FAMILY)),
        st.session_state.get(state.SETUP_ITERATIVE, forms.base_setup_value(state.SETUP_ITERATIVE)),
    )
    try:
        notes = forms.load_file_into_state(uploaded.name, uploaded.getvalue().decode("utf-8"), algorithm)
    except ValueError as error:  # the spec reader's one line, as the CLI prints it: file, line, field
        st.session_state[state.SETUP_NOTICE] = ("error", f"Nothing was loaded: {error}")
        return
    st.session_state[state.SETUP_NOTICE] = (
        "success",
        f"Loaded {uploaded.name}" + (". " + "; ".join(notes) if notes else "."),
    )


def _load_preset() -> None:
    title = st.session_state.get(state.SETUP_PRESET_PICK)
    make, path, _ = forms.PRESETS[title]
    notes = forms.load_spec_into_state(make())
    st.session_state[state.SETUP_NOTICE] = (
        "success",
        f"Loaded the preset {title} (`{path}`)" + (". " + "; ".join(notes) if notes else "."),
    )


if st.session_state.pop(state.SETUP_GO_ROUNDS, False):
    state.switch_page(navigation.ROUNDS_PAGE)

top_preset, top_left, top_right = st.columns(3)
with top_preset, st.container(border=True, height="stretch"):
    st.markdown("**Start from a preset**")
    title = st.selectbox("Preset", list(forms.PRESETS), key=state.SETUP_PRESET_PICK, label_visibility="collapsed")
    blocked = forms.preset_problem(title)
    if blocked:
        st.warning(blocked, icon=":material/download:")
    else:
        st.caption(forms.PRESETS[title][2])
    st.button(
        "Load the preset",
        on_click=_load_preset,
        disabled=bool(blocked),
        icon=":material/bolt:",
        key=state.SETUP_LOAD_PRESET,
    )
with top_left, st.container(border=True, height="stretch"):
    st.markdown("**Reopen a past run**")
    past = services.past_runs()
    if len(past):
        labels = {row.path: services.run_label(row) for row in past.itertuples(index=False)}
        st.selectbox(
            "Past run", list(labels), format_func=labels.get, key=state.SETUP_PAST, label_visibility="collapsed"
        )
        b1, b2 = st.columns(2)
        b1.button(
            "Open it", on_click=_open_past, icon=":material/folder_open:", key=state.SETUP_OPEN_PAST, width="stretch"
        )
        b2.button(
            "Copy its setup here",
            on_click=_copy_past,
            icon=":material/content_copy:",
            key=state.SETUP_COPY_PAST,
            width="stretch",
        )
    else:
        st.caption(f"No runs in {ws.root} yet.")
with top_right, st.container(border=True, height="stretch"):
    st.markdown("**Load a config file**")
    st.file_uploader(
        "Spec or config file",
        type=["json", "yaml", "yml"],
        key=state.SETUP_LOAD_FILE,
        label_visibility="collapsed",
        help="A spec saved with 'Save config' below, or a bare config with CoMLRL's field names.",
    )
    st.button("Apply the file", on_click=_load_file, icon=":material/upload_file:", key=state.SETUP_APPLY_FILE)

# -- the run list: filter, sort, archive, delete ------------------------------------------------------------


def _remove(archive: bool) -> None:
    run_id = st.session_state.get(state.RUNS_PICK)
    if not run_id:
        return
    try:
        where = ws.remove_run(run_id, archive=archive)
    except Exception as error:
        st.session_state[state.SETUP_NOTICE] = ("error", f"{run_id} was kept: {components.format_exception(error)}")
        return
    if state.current_run_id() == run_id:
        state.set_current_run(None)
    st.session_state[state.RUNS_CONFIRM] = False
    done = f"Archived {run_id} to {where}." if archive else f"Deleted {run_id} and its files."
    st.session_state[state.SETUP_NOTICE] = ("success", done)


runs = services.run_list()
if len(runs):
    # Its open state is kept on the server (a key and on_change): left to the browser, the expander closed on every
    # rerun that changed the table (a sort, the confirmation box), hiding Archive and Delete before they were hit.
    runs_list = st.expander(
        f"Your runs ({len(runs)}): filter, sort, archive, delete", key=state.RUNS_LIST, on_change="rerun"
    )
    with runs_list, st.container(key=state.RUNS_BOX):
        cols = st.columns([1, 1, 1, 1, 1, 1])
        algorithms = cols[0].multiselect(
            "Algorithm", sorted(runs["algorithm"].dropna().unique()), key=state.RUNS_ALGORITHM
        )
        tasks = cols[1].multiselect("Task", sorted(runs["task"].dropna().unique()), key=state.RUNS_TASK)
        statuses = cols[2].multiselect(
            "Status",
            sorted(runs["status"].unique()),
            key=state.RUNS_STATUS,
            help="The engine's status for runs this server has open; for the others, what their last snapshot recorded.",
        )
        tags = cols[3].multiselect(
            "Tag",
            sorted({t for run_tags in runs["tags"] for t in run_tags}),
            key=state.RUNS_TAGS,
            help="The runs' tags (a sweep tags each of its runs with its id); a run with any chosen tag is shown.",
        )
        text = cols[4].text_input(
            "Run id contains",
            key=state.RUNS_TEXT,
            help="A run id starts with the run name given here.",
        )
        sort = cols[5].selectbox("Sort", list(frames.RUN_SORTS), key=state.RUNS_SORT)
        shown = frames.filter_runs(
            runs, algorithms=algorithms, tasks=tasks, statuses=statuses, tags=tags, text=text, sort=sort
        )
        st.dataframe(
            shown[["run_id", "algorithm", "task", "agents", "rounds", "tags", "status", "modified"]].assign(
                tags=shown["tags"].map(", ".join)
            ),
            hide_index=True,
            width="stretch",
            key=state.RUNS_TABLE,
        )
        if len(shown):
            labels = {row.run_id: services.run_label(row) for row in shown.itertuples(index=False)}
            pick_col, confirm_col, archive_col, delete_col = st.columns([3, 3, 1, 1], vertical_alignment="bottom")
            picked = pick_col.selectbox("Run", list(labels), format_func=labels.get, key=state.RUNS_PICK)
            status = shown.loc[shown["run_id"] == picked, "status"].iloc[0]
            active = status in ("loading", "running", "pausing", "stopping")
            confirmed = confirm_col.checkbox(
                "Yes, archive or delete this run",
                key=state.RUNS_CONFIRM,
                disabled=active,
                help="Archive moves the folder to _archive/ in the runs folder; delete removes it and all its files.",
            )
            for column, label, archive, icon, key in (
                (archive_col, "Archive", True, ":material/archive:", state.RUNS_ARCHIVE),
                (delete_col, "Delete", False, ":material/delete:", state.RUNS_DELETE),
            ):
                column.button(
                    label,
                    on_click=_remove,
                    args=(archive,),
                    disabled=active or not confirmed,
                    icon=icon,
                    key=key,
                    width="stretch",
                )
            if active:
                st.caption(
                    f"{picked} is {status}: pause or stop it on the Rounds page before archiving or deleting it."
                )
        else:
            st.caption("No run matches these filters.")

# -- agents, task, algorithm -----------------------------------------------------------------------------------

st.header("Agents", divider="gray")
models, agent_problems, footprint_slots = forms.agents_section()

st.header("Task", divider="gray")
task_fields, task_problems = forms.task_section(ws.save_upload, len(models))

st.header("Algorithm", divider="gray")
algorithm = forms.algorithm_section()
config_class = forms.config_class(algorithm)
forms.fill_suggested(algorithm)
values, parse_errors = forms.current_values(algorithm)
config, config_errors = forms.validate(algorithm, forms.overrides(algorithm, values), len(models))
errors = parse_errors + [e for e in config_errors if e.field not in {p.field for p in parse_errors}]
iterative = forms.algorithm_row(algorithm).iterative
st.caption(config_class.__doc__.strip().splitlines()[0] if config_class.__doc__ else "")
forms.render_fields(algorithm, forms.ESSENTIALS, values, errors, columns=5)
for slot, model in zip(footprint_slots, models):
    if model:
        slot.caption(model_picker.describe(model, values))

# -- comparator: the policy and what it needs, then the rest -------------------------------------------------

if iterative:
    st.header("Comparator", divider="gray")
    st.caption(forms.choice_note(algorithm, "comparator_policy", values))
    lead = forms.featured(algorithm, ["comparator_policy", "comparator_num_candidates", "comparator_generation_mode"])
    shown = forms.render_fields(algorithm, lead, values, errors)
    rest = [n for n in forms.COMPARATOR_FIELDS if n not in shown]
    with forms.field_group("More comparator fields", rest, errors):
        forms.render_fields(algorithm, rest, values, errors)
    api = forms.applying(algorithm, forms.API_FIELDS, values)
    if api:
        with st.expander("API comparator settings", expanded=True):
            st.caption("Retries with backoff on 429/5xx and timeouts; bounded concurrency.")
            forms.render_fields(algorithm, api, values, errors)

    # -- replay buffer: the mode and what it needs -------------------------------------------------------------
    st.header("Replay buffer", divider="gray")
    left, right = st.columns([3, 2])
    with left:
        st.caption(forms.choice_note(algorithm, "preference_replay_mode", values))
        shown = forms.render_fields(
            algorithm, forms.featured(algorithm, ["preference_replay_mode"]), values, errors, columns=2
        )
        replay_rest = [n for n in forms.REPLAY_FIELDS if n not in shown]
        with forms.field_group("More replay fields", replay_rest, errors):
            forms.render_fields(algorithm, replay_rest, values, errors, columns=2)
    with right:
        lam_field = "preference_replay_lambda"
        lam = values.get(lam_field)
        rounds = int(values.get("num_iterations") or 1)
        # The config's verdict on λ decides the preview; the page checks nothing itself.
        if lam_field in shown and lam is not None and not forms.field_names_in([lam_field], errors):
            weights = frames.lambda_table(list(range(1, rounds + 1)), float(lam))["weight"].tolist()
            fig = charts.lambda_weights(
                list(range(1, rounds + 1)),
                weights,
                lam=float(lam),
                title=f"Weights in round {rounds} if every round has pairs",
            )
            fig.update_layout(height=260)
            st.plotly_chart(fig, key=state.SETUP_LAMBDA_PREVIEW)
        elif lam_field not in shown:
            st.caption("A mode that uses λ previews its weights here; the Replay page shows them for a run.")

# -- the rest of the fields ---------------------------------------------------------------------------------

st.header("Algorithm settings", divider="gray")
st.caption(
    "Every remaining field of "
    + config_class.__name__
    + ", grouped. Hover the ? beside a field for its help text and default."
)
for title, caption, names in forms.grouped_fields(algorithm):
    with forms.field_group(title, names, errors, label=f"{title} ({len(names)})"):
        st.caption(caption)
        forms.render_fields(algorithm, names, values, errors)

# -- check, create, save ------------------------------------------------------------------------------------

st.header("Create the run", divider="gray")
problems = agent_problems + task_problems
spec_fields = {
    "algorithm": algorithm,
    "agent_models": models or [model_picker.TINY_MODEL_NAME],
    "config": forms.overrides(algorithm, values),
    "name": (st.session_state.get(state.SETUP_RUN_NAME, forms.base_setup_value(state.SETUP_RUN_NAME)) or "").strip()
    or None,
    **task_fields,
}
spec, spec_errors = forms.build_spec(spec_fields)
for error in spec_errors:
    st.error(f"**The spec is invalid (field `{error.field}`):** {error}", icon=":material/error:")
for error in errors:
    where = f" (field `{error.field}`)" if error.field else ""
    st.error(f"**{config_class.__name__} is invalid{where}:** {error}", icon=":material/error:")
for problem in problems:
    st.warning(problem, icon=":material/warning:")
memory = None if errors or problems or spec_errors else model_picker.fit_warning(spec)
if memory:
    st.warning(f"**The agents may not fit in memory:** {memory}.", icon=":material/memory:")
if not errors and not problems and not spec_errors:
    st.success(f"{config_class.__name__} is valid.", icon=":material/check_circle:")

with st.expander("The spec as it will be saved (spec.json)"):
    st.json(spec.to_dict())

name_col, create_col, save_col = st.columns([2, 1, 1], vertical_alignment="bottom")
name_col.text_input(
    "Run name (optional)",
    value=forms.base_setup_value(state.SETUP_RUN_NAME),
    key=state.SETUP_RUN_NAME,
    **forms.KEEP,
    placeholder=algorithm,
    help="Prefix of the run id; the run folder is <runs folder>/<run id>.",
)
can_create = not errors and not problems and not spec_errors
if create_col.button(
    "Create run",
    type="primary",
    disabled=not can_create,
    icon=":material/rocket_launch:",
    key=state.SETUP_CREATE,
    width="stretch",
):
    try:
        run_id = ws.create_run(spec)
    except (ValueError, OSError) as exc:  # what the spec names is not usable here: say it in words
        st.error(f"**The run was not created:** {exc}", icon=":material/error:")
    except Exception as exc:
        st.error(components.format_exception(exc))
    else:
        state.set_current_run(run_id)
        state.switch_page(navigation.ROUNDS_PAGE)
save_col.download_button(
    "Save config",
    data=json.dumps(spec.to_dict(), indent=2, ensure_ascii=False),
    file_name=f"{spec.name or algorithm}.spec.json",
    mime="application/json",
    on_click="ignore",
    disabled=bool(spec_errors),  # the file would differ from the form
    icon=":material/download:",
    key=state.SETUP_SAVE,
    width="stretch",
)
st.caption(
    f"Runs are stored in `{ws.root}` (set COMLRL_LAB_RUNS_DIR to change it). Models load when the first phase starts."
)

draft.write_draft_to_url()
