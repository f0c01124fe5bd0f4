"""The Setup form's widgets: one per config field, drawn from its field spec, plus the agents, task and algorithm.

What a field is (its kind, choices, group, when it applies, its per-choice notes) and how its text reads
(``encode``/``decode``) come from ``trainers/preference/config/fields.py``; this module only turns that into widgets and
session state. A widget for a number, a toggle or a choice holds the value itself; a text box holds the codec's
text. A config is checked the one way the Python API checks it, by constructing it (``fields.collect_errors``):
each ``ConfigError`` names its field, and the form shows it under that field's widget. Widget values persist for
the session (``KEEP``), so leaving the page loses nothing. The URL draft is in ``draft.py``. This module never
starts a run or loads a model.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import streamlit as st

from comlrl_lab.data.tasks import get_task, list_tasks
from comlrl_lab.engine import ExperimentSpec
from comlrl_lab.engine.presets import preset_config, quickstart_spec, smollm2_spec
from comlrl_lab.engine.spec import resolve_task
from comlrl_lab.engine.spec_file import parse_spec_text
from comlrl_lab.models.registry import RegistryError, check_model_name
from comlrl_lab.trainers.preference.algorithms import FAMILIES, algorithm_name
from comlrl_lab.trainers.preference.algorithms import algorithm as algorithm_row
from comlrl_lab.trainers.preference.config import SECRET_FIELDS, ConfigError, fields, resolve
from comlrl_lab.trainers.preference.config.fields import FieldSpec, field_specs
from comlrl_lab.ui import model_picker, state

#: Every Setup widget keeps its value for the session: leaving the page and coming back loses nothing.
# Not Streamlit's bind="query-params": in Chromium its URL writes were lost now and then (a widget whose binding
# the browser had dropped after the form redrew around it), and a bound widget takes the URL's value only as it
# is drawn, after the page has decided from the old values which fields apply. ``draft.py`` writes the URL.
KEEP: dict[str, Any] = {"persist_state": "session"}

#: ``state.SETUP_PRESET``'s values: the spec a session's form starts from.
PRESET_QUICKSTART = "quickstart"
PRESET_NONE = "none"  # CoMLRL's defaults everywhere


@functools.cache
def _quickstart() -> ExperimentSpec:
    return quickstart_spec()


def session_preset() -> ExperimentSpec | None:
    """The spec this session's form starts from: the quickstart preset, or None for CoMLRL's defaults."""
    if st.session_state.get(state.SETUP_PRESET, PRESET_QUICKSTART) == PRESET_NONE:
        return None
    return _quickstart()


#: The "Start from a preset" box: title -> (the spec, where it is a file, what it is).
PRESETS: dict[str, tuple[Any, str, str]] = {
    "Quickstart (embedded model)": (
        quickstart_spec,
        "examples/quickstart.yaml",
        "MADPOIter on the embedded 1M-parameter model with the opt-in MADPO stabilisers: learns visibly in a few CPU "
        "minutes, offline.",
    ),
    "Real model (SmolLM2-135M)": (
        smollm2_spec,
        "examples/smollm2.yaml",
        "MADPOIter on SmolLM2-135M-Instruct, LoRA on both agents, prompts through its chat template; a round "
        "takes about four minutes on two idle CPU cores, and the evaluation reward on stance_agreement rises over "
        "three rounds (README, Does it learn?).",
    ),
}


def preset_problem(title: str) -> str | None:
    """Why preset ``title`` cannot run here (a model it names is not registered, with how to register it), or None."""
    spec = PRESETS[title][0]()
    for model in spec.agent_models:
        try:
            check_model_name(model)
        except RegistryError as error:
            return f"{str(error)[0].upper()}{str(error)[1:]}."
    return None


# ------------------------------------------------------------------------------------------------------------
# Fields: which are drawn where

#: Fields the form does not draw: the literal API key (never typed into a browser, never saved: name its
#: environment variable in comparator_api_key_env), the run folder (the engine sets it) and the agent count
#: (the Agents section sets it).
HIDDEN_FIELDS = frozenset(SECRET_FIELDS | {"output_dir", "num_agents"})

# Groups the Setup page lays out by hand; every other group is an expander of "Algorithm settings".
ESSENTIALS = fields.fields_in_group("Essentials")
COMPARATOR_FIELDS = fields.fields_in_group("Comparator")
API_FIELDS = fields.fields_in_group("API comparator")
REPLAY_FIELDS = fields.fields_in_group("Replay buffer")

#: The expanders of "Algorithm settings", in page order: a field's group (its metadata) -> the expander caption.
#: A group without a caption here lands after these, under its own name.
GROUP_CAPTIONS: dict[str, str] = {
    "Training": "Optimiser, DPO loss and seeding.",
    "MADPO stabilisers": "Opt-in remedies for the seed's reference-free MADPO loss; the defaults are CoMLRL's.",
    "Generation": "How every agent samples its candidates.",
    "Preference pairs": "Which joint responses become pairs, and the oracle that scores them.",
    "Preference source": "Who labels the comparisons: the reward function, people in the Pairs page, or a judge model.",
    "Judge model": "The LLM judge of preference_source='judge', asked through the API client in both orders.",
    "Evaluation": "Fresh samples from the current policy, scored by the task reward.",
    "Reward model (MARLHF)": "The Bradley-Terry reward model fitted on the pairs.",
    "Policy learning (MARLHF)": "Online multi-agent RL against the frozen reward model.",
    "Reference KL": "A fixed-reference KL penalty in MARLHF policy learning (no effect on the MADPO loss).",
    "Devices and collaboration": "Where the agents live and how they work together.",
    "Large models": "LoRA adapters (peft) and gradient checkpointing.",
    "Logging": "Trackers besides the run store: Weights & Biases and TensorBoard.",
    "Multi-turn (fixed for preference training)": "Preference training supports one turn with aligned joint responses.",
}


def config_class(algorithm: str) -> type:
    return algorithm_row(algorithm).config_class


def specs_of(algorithm: str) -> dict[str, FieldSpec]:
    return field_specs(config_class(algorithm))


# ------------------------------------------------------------------------------------------------------------
# Widget values <-> config values


def to_widget(spec: FieldSpec, value: Any) -> Any:
    """A config value as its widget holds it: the codec's text in a text box, a list in a multiselect, else the
    value itself (a choice canonical, a whole float as a float)."""
    if spec.kind in fields.TEXT_KINDS:
        return fields.encode(spec, value)
    if spec.kind == fields.MULTICHOICE:
        return [str(v).strip().lower() for v in ([value] if isinstance(value, str) else value or [])]
    if spec.kind == fields.CHOICE:
        return resolve(spec.metadata, value) or value
    if spec.kind == fields.FLOAT and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if spec.kind == fields.INT and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def from_widget(spec: FieldSpec, raw: Any) -> Any:
    """A widget value as the config takes it; the codec's ``ConfigError`` when a text box spells no value."""
    if spec.kind in fields.TEXT_KINDS:
        return fields.decode(spec, "" if raw is None else raw)
    if spec.kind == fields.MULTICHOICE:
        return list(raw) or None
    return raw


def holds(spec: FieldSpec, raw: Any) -> bool:
    """Whether ``spec``'s widget can hold ``raw`` (a selectbox only its options, a number box only numbers)."""
    if spec.kind == fields.CHOICE:
        return raw in spec.choices
    if spec.kind == fields.MULTICHOICE:
        return isinstance(raw, list) and set(raw) <= set(spec.choices)
    if spec.kind == fields.BOOL:
        return isinstance(raw, bool)
    if spec.kind in (fields.INT, fields.FLOAT):
        number = (int,) if spec.kind == fields.INT else (float,)
        return (raw is None and spec.optional) or (isinstance(raw, number) and not isinstance(raw, bool))
    return isinstance(raw, str)


def base_config_value(algorithm: str, spec: FieldSpec) -> Any:
    """The widget value field ``spec`` of ``algorithm`` starts from: the preset of its family when the session
    starts from the presets, else CoMLRL's default."""
    overrides = preset_config(algorithm) if session_preset() is not None else {}
    if spec.name in overrides:
        return to_widget(spec, overrides[spec.name])
    return to_widget(spec, spec.default)


def base_setup_value(key: str) -> Any:
    """The value the Setup widget ``key`` (agents, task, algorithm, run name) starts from, under the session's preset."""
    preset = session_preset()
    if key == state.SETUP_NUM_AGENTS:
        return len(preset.agent_models) if preset else 2
    if key == state.SETUP_TASK:
        return preset.task if preset and preset.task else list_tasks()[0]
    if key == state.SETUP_MAX_TRAIN_ITEMS:
        return preset.max_train_items if preset else None
    if key == state.SETUP_MAX_EVAL_ITEMS:
        return preset.max_eval_items if preset else None
    if key == state.SETUP_FAMILY:
        return algorithm_row(preset.algorithm).family if preset else FAMILIES[0]
    if key == state.SETUP_ITERATIVE:
        return algorithm_row(preset.algorithm).iterative if preset else True
    if key == state.SETUP_RUN_NAME:
        return (preset.name or "") if preset else ""
    raise KeyError(key)


def raw_value(algorithm: str, spec: FieldSpec) -> Any:
    """What field ``spec``'s widget holds now, or would start from."""
    return st.session_state.get(state.config_field_key(algorithm, spec.name), base_config_value(algorithm, spec))


def current_values(algorithm: str) -> tuple[dict[str, Any], list[ConfigError]]:
    """The form's config values (defaults where the user has not been yet), and every unreadable field.

    A field that does not apply under the chosen modes (a k without nearest_k, a λ without lambda_decay) takes its
    default, so a value left from another mode never blocks the config; its widget keeps the value for when the
    mode comes back.
    """
    values: dict[str, Any] = {}
    errors: list[ConfigError] = []
    specs = specs_of(algorithm)
    for name, spec in specs.items():
        if name in HIDDEN_FIELDS:
            continue
        try:
            values[name] = from_widget(spec, raw_value(algorithm, spec))
        except ConfigError as error:
            values[name] = spec.default
            errors.append(error)
    values = fields.inapplicable_to_default(specs, values)
    return values, [e for e in errors if fields.applies(specs, e.field, values)]


def fill_suggested(algorithm: str) -> None:
    """Fill a field that has just become required and is empty with its suggested value (call before the widgets).

    Choosing lambda_decay with λ empty would otherwise greet the user with a red "required" error; a draft that
    comes back from the URL with lambda_decay gets the same. The filled fields are remembered so the form can say
    what it did (``filled_note``). A field the user empties while it applies stays empty (it is not newly required).
    """
    specs = specs_of(algorithm)
    values, _ = current_values(algorithm)
    seen = st.session_state.setdefault(state.SETUP_APPLICABLE, {})
    filled = st.session_state.setdefault(state.SETUP_FILLED, {})
    before = seen.get(algorithm) or set()
    for name, value in fields.suggestions(specs, values).items():
        if name not in before and raw_value(algorithm, specs[name]) is None:
            key = state.config_field_key(algorithm, name)
            st.session_state[key] = filled[key] = to_widget(specs[name], value)
    seen[algorithm] = {n for n, spec in specs.items() if spec.applies_when and fields.applies(specs, n, values)}


def filled_note(algorithm: str, name: str) -> str | None:
    """The note under a field the form filled in, while it still holds the filled value."""
    key = state.config_field_key(algorithm, name)
    filled = st.session_state.get(state.SETUP_FILLED, {})
    if key in filled and st.session_state.get(key) == filled[key]:
        return f"Filled in {filled[key]:g} because {name} is required in this mode; change it freely."
    return None


def overrides(algorithm: str, values: Mapping[str, Any]) -> dict[str, Any]:
    """The values that differ from the config class's defaults: what a spec file stores."""
    return fields.overrides(config_class(algorithm), values)


def validate(
    algorithm: str, config_overrides: Mapping[str, Any], num_agents: int
) -> tuple[Any | None, list[ConfigError]]:
    """Build the config as the Python API does; on failure, the error of every field that fails (each names its
    field), so the form shows them all at once."""
    return fields.collect_errors(config_class(algorithm), {**config_overrides, "num_agents": int(num_agents)})


#: Spec fields the form can leave out (None: every item) when the spec refuses the value typed.
OPTIONAL_SPEC_FIELDS = ("max_train_items", "max_eval_items")


def build_spec(spec_fields: Mapping[str, Any]) -> tuple[ExperimentSpec, list[ConfigError]]:
    """The spec the form describes, checked as the Python API checks it (``ExperimentSpec.__post_init__``), and the
    error of each first-N field it refuses; such a field is left out (None) of the spec returned, so the page can
    still show it, and Create must stay disabled while there are errors."""
    spec_fields = dict(spec_fields)
    errors: list[ConfigError] = []
    while True:
        try:
            return ExperimentSpec(**spec_fields), errors
        except ConfigError as error:
            if error.field not in OPTIONAL_SPEC_FIELDS or spec_fields.get(error.field) is None:
                raise
            errors.append(error)
            spec_fields[error.field] = None


def load_config_into_state(algorithm: str, config: Mapping[str, Any]) -> list[str]:
    """Put a spec's config overrides into the widgets of ``algorithm``; returns messages about values the form
    cannot hold. The spec was read by ``ExperimentSpec.read`` or ``load``, which refuse an unknown field."""
    specs = specs_of(algorithm)
    notes = []
    for name, spec in specs.items():
        if name in HIDDEN_FIELDS:
            continue
        value = config.get(name, spec.default)
        raw = to_widget(spec, value)
        if not holds(spec, raw):
            notes.append(f"{name}: the form cannot hold {value!r}; kept the default")
            raw = to_widget(spec, spec.default)
        st.session_state[state.config_field_key(algorithm, name)] = raw
    return notes


def load_spec_into_state(spec: ExperimentSpec) -> list[str]:
    """Fill every Setup widget from a spec (a loaded file or a past run); returns notes about skipped values."""
    row = algorithm_row(spec.algorithm)
    st.session_state[state.SETUP_FAMILY] = row.family
    st.session_state[state.SETUP_ITERATIVE] = row.iterative
    st.session_state[state.SETUP_NUM_AGENTS] = len(spec.agent_models)
    for i, model in enumerate(spec.agent_models):
        choice, text = model_picker.choice_for(model)
        st.session_state[state.agent_source_key(i)] = choice
        if text is not None:
            st.session_state[state.agent_model_key(i)] = text
    if spec.user_task:
        st.session_state[state.SETUP_TASK_KIND] = TASK_KINDS[1]
        st.session_state[state.SETUP_USER_MODULE] = spec.user_task
        st.session_state[state.SETUP_USER_TRAIN] = spec.user_train_data or ""
        st.session_state[state.SETUP_USER_EVAL] = spec.user_eval_data or ""
    else:
        st.session_state[state.SETUP_TASK_KIND] = TASK_KINDS[0]
        if spec.task:
            st.session_state[state.SETUP_TASK] = spec.task
    st.session_state[state.SETUP_MAX_TRAIN_ITEMS] = spec.max_train_items
    st.session_state[state.SETUP_MAX_EVAL_ITEMS] = spec.max_eval_items
    st.session_state[state.SETUP_RUN_NAME] = spec.name or ""
    return load_config_into_state(spec.algorithm, spec.config)


def load_file_into_state(name: str, text: str, algorithm: str) -> list[str]:
    """Read a spec file, or a bare config of CoMLRL field names for ``algorithm``, exactly as the CLI reads a spec
    (``ExperimentSpec.read``: the same refusals, located), and put it into the widgets; returns notes."""
    bare = not ExperimentSpec.holds_spec_keys(parse_spec_text(text, name))
    spec = ExperimentSpec.read(text, name, bare_config_of=algorithm)
    return load_config_into_state(algorithm, spec.config) if bare else load_spec_into_state(spec)


# ------------------------------------------------------------------------------------------------------------
# Sections laid out from the metadata


def featured(algorithm: str, lead: Sequence[str]) -> list[str]:
    """``lead`` and, after it, the fields of its group that apply only under some values of a lead field (their
    ``applies_when`` names it): the comparator's model or history settings, the replay mode's k, λ and size."""
    specs = specs_of(algorithm)
    group = specs[lead[0]].group
    dependents = [
        name
        for name, spec in specs.items()
        if name not in lead and spec.group == group and any(c in lead for c in spec.applies_when)
    ]
    return [*lead, *dependents]


def choice_note(algorithm: str, name: str, values: Mapping[str, Any]) -> str:
    """The note of the value choice field ``name`` holds (its ``choice_help``), or ""."""
    spec = specs_of(algorithm)[name]
    return spec.choice_help.get(resolve(spec.metadata, values.get(name, spec.default)) or "", "")


def applying(algorithm: str, names: Iterable[str], values: Mapping[str, Any]) -> list[str]:
    """The named fields ``algorithm``'s config has, drawn by the form, that apply under ``values``."""
    specs = specs_of(algorithm)
    return [n for n in names if n in specs and n not in HIDDEN_FIELDS and fields.applies(specs, n, values)]


def grouped_fields(algorithm: str) -> list[tuple[str, str, list[str]]]:
    """The "Algorithm settings" groups that apply to ``algorithm`` (fields shown elsewhere left out)."""
    shown_elsewhere = set(ESSENTIALS) | set(COMPARATOR_FIELDS) | set(API_FIELDS) | set(REPLAY_FIELDS) | HIDDEN_FIELDS
    by_group: dict[str, list[str]] = {title: [] for title in GROUP_CAPTIONS}
    for name, spec in specs_of(algorithm).items():
        if name not in shown_elsewhere:
            by_group.setdefault(spec.group, []).append(name)
    return [(title, GROUP_CAPTIONS.get(title, ""), names) for title, names in by_group.items() if names]


def field_names_in(names: Iterable[str], errors: Sequence[ConfigError]) -> bool:
    return any(e.field in set(names) for e in errors)


def field_group(title: str, names: Iterable[str], errors: Sequence[ConfigError], *, label: str | None = None):
    """An expander of Setup fields whose open state is kept on the server (a key and ``on_change``), opened when one
    of ``names`` has an error. ``label`` is what it shows, ``title`` by default.

    Left to the browser, an expander closed on every rerun that changed what it holds: an edit inside it (a new
    ``dpo_beta``, the fields ``preference_source="human"`` reveals) hid the field just edited.
    """
    key = state.setup_group_key(title)
    if field_names_in(names, errors):
        st.session_state[key] = True
    return st.expander(label or title, key=key, on_change="rerun")


# ------------------------------------------------------------------------------------------------------------
# Drawing fields


def _float_step(default: Any) -> float:
    if isinstance(default, (int, float)) and not isinstance(default, bool) and default:
        return float(10 ** math.floor(math.log10(abs(float(default)))))
    return 0.01


def _tooltip(spec: FieldSpec) -> str:
    default = "None" if spec.default is None else repr(spec.default)
    return f"{spec.help}\n\nDefault: `{default}`"


def _placeholder(spec: FieldSpec) -> str:
    none_text = f"None = {spec.none_means}" if spec.none_means else "None"
    if spec.kind == fields.JSON:
        return f'{none_text}, or a JSON object such as {{"k": "v"}}'
    if spec.kind in (fields.ONE_OR_LIST, fields.LIST):
        return f"{none_text}; or {'one value or ' if spec.kind == fields.ONE_OR_LIST else ''}a comma-separated list"
    return none_text if spec.optional else ""


def start_optional_number(key: str, base: Any) -> None:
    """Give an optional number box its start value (call before the widget).

    Streamlit lets a number box be emptied only when its widget was made with ``value=None``; made with a
    number, emptying it snaps back. So an optional box is always made with ``value=None`` and its start value goes
    in through the session state.
    """
    if key not in st.session_state and base is not None:
        st.session_state[key] = base


def render_field(algorithm: str, spec: FieldSpec, errors: Sequence[ConfigError] = ()) -> None:
    """One config field's widget, with CoMLRL's validation message under it when the error is about this field.

    The widget's default is always the field's start value (``base_config_value``), the value the URL's draft
    is written against.
    """
    key = state.config_field_key(algorithm, spec.name)
    label = spec.name
    base = base_config_value(algorithm, spec)
    common: dict[str, Any] = {"key": key, "help": _tooltip(spec), **KEEP}
    if spec.kind in (fields.INT, fields.FLOAT):
        if spec.optional:
            start_optional_number(key, base)
        number: dict[str, Any] = {"value": None if spec.optional else base, "placeholder": _placeholder(spec) or None}
        if spec.kind == fields.INT:
            st.number_input(label, step=1, format="%d", **number, **common)
        else:
            st.number_input(label, step=_float_step(spec.default), format="%g", **number, **common)
    elif spec.kind == fields.BOOL:
        st.toggle(label, value=bool(base), **common)
    elif spec.kind == fields.CHOICE:
        options = list(spec.choices)
        st.selectbox(label, options, index=options.index(base) if base in options else 0, **common)
    elif spec.kind == fields.MULTICHOICE:
        st.multiselect(label, list(spec.choices), default=base, placeholder="None", **common)
    elif spec.kind == fields.JSON:
        st.text_area(label, value=base, placeholder=_placeholder(spec), height=80, **common)
    elif spec.metadata.get("multiline"):
        st.text_area(label, value=base, placeholder=_placeholder(spec), height=160, **common)
    else:
        st.text_input(label, value=base, placeholder=_placeholder(spec), **common)
    note = filled_note(algorithm, spec.name)
    if note:
        st.caption(note)
    for error in errors:
        if error.field == spec.name:
            st.error(str(error), icon=":material/error:")


def render_fields(
    algorithm: str,
    names: Sequence[str],
    values: Mapping[str, Any],
    errors: Sequence[ConfigError],
    *,
    columns: int = 3,
) -> list[str]:
    """Draw the named fields that apply under ``values``, ``columns`` to a row; returns the names drawn."""
    specs = specs_of(algorithm)
    present = applying(algorithm, names, values)
    for start in range(0, len(present), columns):
        cols = st.columns(columns)
        for col, name in zip(cols, present[start : start + columns]):
            with col:
                render_field(algorithm, specs[name], errors)
    return present


# ------------------------------------------------------------------------------------------------------------
# Agents and task: the parts of the spec that are not config fields

TASK_KINDS = ("Built-in task", "Your own task module")
#: The most agents the Agents section offers (``agents_section``).
MAX_AGENTS = 8


def agents_section(max_agents: int = MAX_AGENTS) -> tuple[list[str], list[str], list[Any]]:
    """Agent count and one model picker per agent. Returns (model ids/paths, problems, one empty container per agent
    for ``model_picker.describe``, drawn once the LoRA fields are read)."""
    # No min_value/max_value on the number boxes of this page: Streamlit's browser side drops a value outside them
    # with only a red outline, so the run would differ from the form. The config (num_agents) and the spec
    # (max_train_items, max_eval_items) refuse such values in one line, which disables Create.
    n = st.number_input(
        "Number of agents",
        step=1,
        key=state.SETUP_NUM_AGENTS,
        **KEEP,
        help="One policy per agent role; the task's formatters give each agent its own prompt.",
        value=base_setup_value(state.SETUP_NUM_AGENTS),
    )
    models: list[str] = []
    problems: list[str] = []
    slots: list[Any] = []
    registered = model_picker.registered()
    if n is not None and int(n) > max_agents:
        problems.append(f"Number of agents: the form offers at most {max_agents} agents, not {int(n)}.")
    for i in range(min(int(n or 0), max_agents)):
        model, problem = model_picker.model_picker(i, registered)
        models.append(model)
        if problem:
            problems.append(problem)
        slots.append(st.container(key=state.agent_footprint_key(i)))
    return models, problems, slots


def agent_count_problem(task: Any, num_agents: int) -> str | None:
    """The form's message when the task is written for another number of agents than the Agents section has."""
    if task.num_agents == num_agents:
        return None
    return (
        f"Task {task.title} has prompts for {task.num_agents} agents, the Agents section has {num_agents}: set "
        f"Number of agents to {task.num_agents} (otherwise Collect fails: Number of formatters must match num_agents)."
    )


def task_section(save_upload, num_agents: int) -> tuple[dict[str, Any], list[str]]:
    """Built-in task or a user module with data files; returns (spec fields, problems)."""
    kind = st.segmented_control(
        "Task source",
        TASK_KINDS,
        key=state.SETUP_TASK_KIND,
        **KEEP,
        required=True,
        default=TASK_KINDS[0],
    )
    problems: list[str] = []
    fields_: dict[str, Any] = {"task": None, "user_task": None, "user_train_data": None, "user_eval_data": None}
    if kind == TASK_KINDS[0]:
        names = list_tasks()
        base = base_setup_value(state.SETUP_TASK)
        name = st.selectbox(
            "Built-in task",
            names,
            index=names.index(base) if base in names else 0,
            key=state.SETUP_TASK,
            **KEEP,
            format_func=lambda n: f"{get_task(n).title} ({n})",
            help="Small cooperative tasks shipped with comlrl-lab; they run with the embedded tiny model and no network.",
        )
        task = get_task(name)
        st.caption(
            f"{task.description}  \nAgents: {task.num_agents} · reward range {task.reward_range[0]:g} to {task.reward_range[1]:g} "
            f"· {len(task.train_items())} train items, {len(task.eval_items())} eval items"
        )
        fields_["task"] = name
        mismatch = agent_count_problem(task, num_agents)
        if mismatch:
            problems.append(mismatch)
    else:
        left, right = st.columns(2)
        with left:
            module = st.text_input(
                "Task module",
                key=state.SETUP_USER_MODULE,
                **KEEP,
                placeholder="my_package.my_task  or  /path/to/my_task.py",
                help="A module defining reward_func (CoMLRL's convention), optionally formatters, reward_processor, "
                "NUM_AGENTS, DATA_PATH and EVAL_DATA_PATH.",
            ).strip()
            uploaded = st.file_uploader("…or upload the module (.py)", type=["py"], key=state.SETUP_USER_MODULE_UPLOAD)
            if uploaded is not None:
                module = str(save_upload(uploaded.name, uploaded.getvalue()))
                st.caption(f"Saved as `{module}`")
        with right:
            train = _data_input("Training data", state.SETUP_USER_TRAIN, save_upload)
            evald = _data_input("Evaluation data (optional)", state.SETUP_USER_EVAL, save_upload)
        if not module:
            problems.append("Task: name a task module or upload one.")
        fields_.update(user_task=module or None, user_train_data=train, user_eval_data=evald)
        if module and st.button(
            "Check the task",
            key=state.SETUP_CHECK_TASK,
            icon=":material/fact_check:",
            help="Import the module and read the data now, as the first phase will.",
        ):
            try:
                task = resolve_task(
                    ExperimentSpec(task=None, user_task=module, user_train_data=train, user_eval_data=evald)
                )
            except Exception as error:  # user code: any exception is the user's to see
                st.error(f"The task cannot be loaded: {type(error).__name__}: {error}", icon=":material/error:")
            else:
                st.success(
                    f"{task.title}: {task.num_agents} agents, {len(task.train_items())} training items, "
                    f"{len(task.eval_items())} evaluation items.",
                    icon=":material/check_circle:",
                )
                mismatch = agent_count_problem(task, num_agents)
                if mismatch:
                    problems.append(mismatch)
    left, right = st.columns(2)
    start_optional_number(state.SETUP_MAX_TRAIN_ITEMS, base_setup_value(state.SETUP_MAX_TRAIN_ITEMS))
    start_optional_number(state.SETUP_MAX_EVAL_ITEMS, base_setup_value(state.SETUP_MAX_EVAL_ITEMS))
    with left:
        fields_["max_train_items"] = st.number_input(
            "Use the first N training items",
            step=1,
            key=state.SETUP_MAX_TRAIN_ITEMS,
            **KEEP,
            placeholder="all",
            help="Empty = every item. A small N makes a quick first look (a round takes seconds).",
            value=None,
        )
    with right:
        fields_["max_eval_items"] = st.number_input(
            "Use the first N evaluation items",
            step=1,
            key=state.SETUP_MAX_EVAL_ITEMS,
            **KEEP,
            placeholder="all",
            help="Empty = every item (eval_num_samples still caps each evaluation).",
            value=None,
        )
    return fields_, problems


def _data_input(label: str, key: str, save_upload) -> str | None:
    path = st.text_input(label, key=key, **KEEP, placeholder="/path/to/items.jsonl (or .csv / .json)").strip()
    uploaded = st.file_uploader(f"…or upload {label.lower()}", type=["jsonl", "json", "csv"], key=state.upload_key(key))
    if uploaded is not None:
        path = str(save_upload(uploaded.name, uploaded.getvalue()))
        st.caption(f"Saved as `{path}`")
    return path or None


def algorithm_section() -> str:
    """MADPO or MARLHF, iterative or not; returns the algorithm name (a row of the algorithm table)."""
    left, right = st.columns([1, 2], vertical_alignment="bottom")
    with left:
        family = st.segmented_control(
            "Algorithm",
            FAMILIES,
            key=state.SETUP_FAMILY,
            **KEEP,
            required=True,
            help="MADPO: joint-margin DPO on the pairs. MARLHF: a Bradley-Terry reward model, then online multi-agent RL.",
            default=base_setup_value(state.SETUP_FAMILY),
        )
    with right:
        iterative = st.toggle(
            "Iterative (rounds against a comparator, with a replay buffer)",
            key=state.SETUP_ITERATIVE,
            **KEEP,
            help="MADPOIter / MARLHFIter repeat collect -> select -> train -> evaluate for num_iterations rounds.",
            value=base_setup_value(state.SETUP_ITERATIVE),
        )
    return algorithm_name(family, iterative)
