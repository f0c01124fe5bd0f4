"""The Setup form: widgets generated from the config dataclasses, and validation by building the config.

Every config field becomes a widget chosen from its type (toggle, number, choice, text, device list, JSON), with
the field name as label and its ``metadata["help"]`` plus the default as tooltip; the options of a choice
field and the section a field sits in are its ``metadata["choices"]``, ``["aliases"]`` and ``["group"]``. So the
form follows the configs without a list of its own to keep in step. A config is checked the one way the Python API checks it:
by constructing it. The ``ValueError`` is shown next to the field its message names (CoMLRL's messages start
with the field). Widget values persist for the session (``KEEP``), so leaving the page loses nothing.

The draft also lives in the URL, so a reload or a shared link rebuilds the same form: every widget starts from
the value the form starts from (``base_config_value``, ``base_setup_value``: the quickstart preset, else CoMLRL's
default), the page writes the values that differ from it into the query at the end of each run
(``write_draft_to_url``), and a new session reads them back before any widget is drawn (``read_draft_from_url``).
This module draws widgets and builds specs; it never starts a run or loads a model.
"""

from __future__ import annotations

import functools
import json
import math
import re
import typing
from collections.abc import Iterable, Sequence
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

import streamlit as st

from comlrl_lab.data.tasks import get_task, list_tasks
from comlrl_lab.engine import ExperimentSpec
from comlrl_lab.engine.presets import preset_config, quickstart_spec
from comlrl_lab.engine.spec import resolve_task
from comlrl_lab.models.tiny_model import TINY_MODEL_NAME, is_tiny_model_name
from comlrl_lab.trainers.preference import config as config_module
from comlrl_lab.trainers.preference.algorithms import FAMILIES, algorithm_name
from comlrl_lab.trainers.preference.algorithms import algorithm as algorithm_row
from comlrl_lab.ui import state

#: Every Setup widget keeps its value for the session: leaving the page and coming back loses nothing.
# Not Streamlit's bind="query-params": in Chromium its URL writes were lost now and then (a widget whose binding
# the browser had dropped after the form redrew around it), and a bound widget takes the URL's value only as it
# is drawn, after the page has decided from the old values which fields apply. The URL is written by
# ``write_draft_to_url`` instead.
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


# ------------------------------------------------------------------------------------------------------------
# Fields: kinds, choices, groups

#: Fields the form does not draw: the literal API key (never typed into a browser, never saved: name its
#: environment variable in comparator_api_key_env), the run folder (the engine sets it) and the agent count
#: (the Agents section sets it).
HIDDEN_FIELDS = frozenset(config_module.SECRET_FIELDS | {"output_dir", "num_agents"})


def _fields_in_group(group: str) -> tuple[str, ...]:
    """Every config field whose ``metadata["group"]`` is ``group``, in declaration order across the configs."""
    names: dict[str, None] = {}
    for cls in config_module.CONFIG_CLASSES.values():
        names.update((f.name, None) for f in fields(cls) if f.metadata["group"] == group)
    return tuple(names)


# Groups the Setup page lays out by hand; every other group is an expander of "Algorithm settings".
ESSENTIALS = _fields_in_group("Essentials")
COMPARATOR_FIELDS = _fields_in_group("Comparator")
API_FIELDS = _fields_in_group("API comparator")
REPLAY_FIELDS = _fields_in_group("Replay buffer")

#: The expanders of "Algorithm settings", in page order: a field's group (its metadata) -> the expander caption.
#: A group without a caption here lands after these, under its own name.
GROUP_CAPTIONS: dict[str, str] = {
    "Training": "Optimiser, DPO loss and seeding.",
    "MADPO stabilisers": "Opt-in remedies for the seed's reference-free MADPO loss; the defaults are CoMLRL's.",
    "Generation": "How every agent samples its candidates.",
    "Preference pairs": "Which joint responses become pairs, and the oracle that scores them.",
    "Evaluation": "Fresh samples from the current policy, scored by the task reward.",
    "Reward model (MARLHF)": "The Bradley-Terry reward model fitted on the pairs.",
    "Policy learning (MARLHF)": "Online multi-agent RL against the frozen reward model.",
    "Reference KL": "A fixed-reference KL penalty in MARLHF policy learning (no effect on the MADPO loss).",
    "Devices and collaboration": "Where the agents live and how they work together.",
    "Large models": "LoRA adapters (peft) and gradient checkpointing.",
    "Logging": "Trackers besides the run store: Weights & Biases and TensorBoard.",
    "Multi-turn (fixed for preference training)": "Preference training supports one turn with aligned joint responses.",
}


@dataclass(frozen=True)
class FieldSpec:
    """How one config field is drawn and read back."""

    name: str
    kind: str  # bool | int | float | choice | multichoice | text | devices | list | json
    optional: bool
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict, hash=False)
    group: str = ""
    #: controlling field -> the values under which this field means something (``metadata["applies_when"]``).
    applies_when: dict[str, tuple[str, ...]] = field(default_factory=dict, hash=False)
    #: the value the form fills in when the field becomes required and is empty (``metadata["suggested"]``).
    suggested: Any = None
    #: what None stands for, shown in the empty box (``metadata["none_means"]``).
    none_means: str = ""


@dataclass(frozen=True)
class FieldError:
    """A message to show, and the field it belongs to (None: the config as a whole)."""

    field: str | None
    message: str


def _kind(hint: Any, name: str, config_class: type) -> tuple[str, bool]:
    args = typing.get_args(hint)
    optional = type(None) in args
    if config_module.field_choices(config_class, name):
        return "choice", optional
    if config_module.field_multi_choices(config_class, name):
        return "multichoice", optional
    if hint is bool:
        return "bool", False
    if hint is int or (optional and set(args) == {int, type(None)}):
        return "int", optional
    if hint is float or (optional and set(args) == {float, type(None)}):
        return "float", optional
    if typing.get_origin(hint) is dict or any(typing.get_origin(a) is dict for a in args):
        return "json", optional
    if name.endswith("_devices"):
        return "devices", optional
    if typing.get_origin(hint) is list or any(typing.get_origin(a) is list for a in args):
        return "list", optional
    return "text", optional


def field_specs(config_class: type) -> dict[str, FieldSpec]:
    """Every field of ``config_class`` in declaration order, with its widget kind, default and help text."""
    hints = typing.get_type_hints(config_class)
    specs: dict[str, FieldSpec] = {}
    for f in fields(config_class):
        kind, optional = _kind(hints[f.name], f.name, config_class)
        default = (
            f.default
            if f.default is not MISSING
            else (f.default_factory() if f.default_factory is not MISSING else None)
        )  # type: ignore[misc]
        specs[f.name] = FieldSpec(
            f.name,
            kind,
            optional,
            default,
            f.metadata.get("help", ""),
            config_module.field_choices(config_class, f.name)
            or config_module.field_multi_choices(config_class, f.name),
            config_module.field_aliases(config_class, f.name),
            f.metadata["group"],
            dict(f.metadata.get("applies_when", {})),
            f.metadata.get("suggested"),
            f.metadata.get("none_means", ""),
        )
    return specs


def config_class(algorithm: str) -> type:
    return algorithm_row(algorithm).config_class


# ------------------------------------------------------------------------------------------------------------
# Raw widget values <-> config values


def canonical_choice(spec: FieldSpec, value: Any) -> Any:
    """The canonical name a choice field's value spells; any other value as it is, for the caller to flag."""
    if not isinstance(value, str):
        return value
    key = value.strip().lower()
    return key if key in spec.choices else spec.aliases.get(key, value)


def to_raw(spec: FieldSpec, value: Any) -> Any:
    """A config value as its widget holds it."""
    if spec.kind in ("text",):
        return "" if value is None else str(value)
    if spec.kind == "devices":
        if value is None:
            return ""
        return ", ".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
    if spec.kind == "list":
        return "" if value is None else ", ".join(str(v) for v in value)
    if spec.kind == "multichoice":
        values = [value] if isinstance(value, str) else list(value or [])
        return [str(v).strip().lower() for v in values]
    if spec.kind == "json":
        return "" if value is None else json.dumps(value, ensure_ascii=False)
    if spec.kind == "choice":
        return canonical_choice(spec, value)
    if spec.kind == "float" and value is not None and not isinstance(value, bool):
        return float(value)
    if spec.kind == "int" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def from_raw(spec: FieldSpec, raw: Any) -> Any:
    """A widget value as the config takes it; ``ValueError`` naming the field when it cannot be read."""
    if spec.kind in ("bool", "int", "float", "choice"):
        return raw
    if spec.kind == "multichoice":
        return list(raw) or None
    text = "" if raw is None else str(raw).strip()
    if spec.kind == "text":
        if not text and spec.optional:
            return None
        return str(raw) if raw is not None else ""
    if not text:
        return None
    if spec.kind == "devices":
        parts = [p.strip() for p in text.split(",") if p.strip()]
        return parts[0] if len(parts) == 1 else parts
    if spec.kind == "list":
        return [p.strip() for p in text.split(",") if p.strip()]
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{spec.name} must be a JSON object: {error.msg} at column {error.colno}.") from None
    if not isinstance(value, dict):
        raise ValueError(f"{spec.name} must be a JSON object, got {type(value).__name__}.")
    return value


def _raw_default(spec: FieldSpec) -> Any:
    return to_raw(spec, spec.default)


def base_config_value(algorithm: str, spec: FieldSpec) -> Any:
    """The raw value field ``spec`` of ``algorithm`` starts from: the session's preset's, else CoMLRL's default."""
    overrides = preset_config(algorithm) if session_preset() is not None else {}
    if spec.name in overrides:
        return to_raw(spec, overrides[spec.name])
    return _raw_default(spec)


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


@dataclass(frozen=True)
class DraftField:
    """One Setup widget as the URL's draft carries it: its key, how its value is spelled, and its start value."""

    key: str
    kind: str  # bool | int | float | choice | multichoice | text (json, devices and list fields are text here)
    base: Any
    choices: tuple[str, ...] = ()
    optional: bool = False


#: The most agents the Agents section offers (``agents_section``).
MAX_AGENTS = 8


def draft_fields() -> dict[str, DraftField]:
    """Every Setup widget the draft in the URL may carry, by key: the agents, task and algorithm widgets, the run
    name, and every config field of every algorithm (each algorithm keeps its own values)."""
    out = [
        DraftField(state.SETUP_NUM_AGENTS, "int", base_setup_value(state.SETUP_NUM_AGENTS)),
        DraftField(state.SETUP_TASK_KIND, "choice", TASK_KINDS[0], TASK_KINDS),
        DraftField(state.SETUP_TASK, "choice", base_setup_value(state.SETUP_TASK), tuple(list_tasks())),
        DraftField(state.SETUP_USER_MODULE, "text", ""),
        DraftField(state.SETUP_USER_TRAIN, "text", ""),
        DraftField(state.SETUP_USER_EVAL, "text", ""),
        DraftField(state.SETUP_FAMILY, "choice", base_setup_value(state.SETUP_FAMILY), tuple(FAMILIES)),
        DraftField(state.SETUP_ITERATIVE, "bool", base_setup_value(state.SETUP_ITERATIVE)),
        DraftField(state.SETUP_RUN_NAME, "text", base_setup_value(state.SETUP_RUN_NAME)),
    ]
    for key in (state.SETUP_MAX_TRAIN_ITEMS, state.SETUP_MAX_EVAL_ITEMS):
        out.append(DraftField(key, "int", base_setup_value(key), optional=True))
    for i in range(MAX_AGENTS):
        out.append(DraftField(state.agent_source_key(i), "choice", AGENT_SOURCES[0], AGENT_SOURCES))
        out.append(DraftField(state.agent_model_key(i), "text", ""))
    for algorithm, cls in config_module.CONFIG_CLASSES.items():
        for name, spec in field_specs(cls).items():
            if name in HIDDEN_FIELDS:
                continue
            kind = spec.kind if spec.kind in ("bool", "int", "float", "choice", "multichoice") else "text"
            out.append(
                DraftField(
                    state.config_field_key(algorithm, name),
                    kind,
                    base_config_value(algorithm, spec),
                    spec.choices,
                    spec.optional and kind in ("int", "float"),
                )
            )
    return {f.key: f for f in out}


def encode_draft_value(f: DraftField, value: Any) -> str:
    """A widget value as the URL spells it (an emptied number box is an empty string)."""
    if value is None:
        return ""
    if f.kind == "bool":
        return "true" if value else "false"
    if f.kind == "multichoice":
        return ",".join(value)
    return str(value)


def decode_draft_value(f: DraftField, text: str) -> Any:
    """The widget value the URL spells; ``ValueError`` when it is not one the widget can hold."""
    if f.kind == "bool":
        if text not in ("true", "false"):
            raise ValueError(f"{text!r} is not true or false")
        return text == "true"
    if f.kind in ("int", "float"):
        if text == "" and f.optional:
            return None
        value = int(text) if f.kind == "int" else float(text)
        if f.kind == "float" and not math.isfinite(value):
            raise ValueError(f"{text!r} is not a finite number")
        return value
    if f.kind == "choice":
        if text not in f.choices:
            raise ValueError(f"{text!r} is not one of {', '.join(f.choices)}")
        return text
    if f.kind == "multichoice":
        values = [v for v in text.split(",") if v]
        unknown = [v for v in values if v not in f.choices]
        if unknown:
            raise ValueError(f"{', '.join(unknown)} not among {', '.join(f.choices)}")
        return values
    return text


def read_draft_from_url() -> list[str]:
    """Put the URL's draft into the session, before any Setup widget is drawn; returns notes about values skipped.

    Call once, at a session's first Setup run: later runs keep what the widgets hold.
    """
    fields_ = draft_fields()
    notes = []
    for key in st.query_params:
        f = fields_.get(key)
        if f is None:
            continue
        try:
            st.session_state[key] = decode_draft_value(f, st.query_params[key])
        except ValueError as error:
            notes.append(f"{key}: {error}; kept the start value")
    return notes


def write_draft_to_url() -> None:
    """Keep the URL's query on the draft: every Setup value that differs from its start value (call last).

    The whole draft is written from the session on every run, so a write that raced with another (the browser
    sends the next change while this run still works) is put right by the next run.
    """
    fields_ = draft_fields()
    wanted = {
        key: encode_draft_value(f, st.session_state[key])
        for key, f in fields_.items()
        if key in st.session_state and st.session_state[key] != f.base
    }
    present = {key: st.query_params[key] for key in st.query_params if key in fields_}
    if wanted == present:
        return
    for key in present.keys() - wanted.keys():
        del st.query_params[key]
    st.query_params.update({key: text for key, text in wanted.items() if present.get(key) != text})


def raw_value(algorithm: str, spec: FieldSpec) -> Any:
    """What field ``spec``'s widget holds now, or would start from."""
    return st.session_state.get(state.config_field_key(algorithm, spec.name), base_config_value(algorithm, spec))


def applies(algorithm: str, spec: FieldSpec, values: dict[str, Any]) -> bool:
    """Whether ``spec``'s field means something under the form's other values (its ``applies_when``)."""
    cls = config_class(algorithm)
    for controller, allowed in spec.applies_when.items():
        if controller in values and config_module.resolve_choice(cls, controller, values[controller]) not in allowed:
            return False
    return True


def current_values(algorithm: str) -> tuple[dict[str, Any], list[FieldError]]:
    """The form's config values (defaults where the user has not been yet), and every unreadable field.

    A field that does not apply under the chosen modes (a k without nearest_k, a λ without lambda_decay) takes its
    default, so a value left from another mode never blocks the config; its widget keeps the value for when the
    mode comes back.
    """
    values: dict[str, Any] = {}
    errors: list[FieldError] = []
    specs = field_specs(config_class(algorithm))
    for name, spec in specs.items():
        if name in HIDDEN_FIELDS:
            continue
        raw = raw_value(algorithm, spec)
        try:
            values[name] = from_raw(spec, raw)
        except ValueError as exc:
            values[name] = spec.default
            errors.append(FieldError(name, str(exc)))
    for name in list(values):
        if not applies(algorithm, specs[name], values):
            values[name] = specs[name].default
    return values, [e for e in errors if applies(algorithm, specs[e.field], values)]


def fill_suggested(algorithm: str) -> None:
    """Fill a field that has just become required and is empty with its suggested value (call before the widgets).

    Choosing lambda_decay with λ empty would otherwise greet the user with a red "required" error; a draft that
    comes back from the URL with lambda_decay gets the same. The filled fields are remembered so the form can say
    what it did (``filled_note``). A field the user empties while it applies stays empty (it is not newly required).
    """
    specs = field_specs(config_class(algorithm))
    values, _ = current_values(algorithm)
    seen = st.session_state.setdefault(state.SETUP_APPLICABLE, {})
    filled = st.session_state.setdefault(state.SETUP_FILLED, {})
    now = {n for n, spec in specs.items() if spec.applies_when and applies(algorithm, spec, values)}
    before = seen.get(algorithm)
    for name in now - (before or set()):
        spec = specs[name]
        key = state.config_field_key(algorithm, name)
        if spec.suggested is not None and raw_value(algorithm, spec) is None:
            st.session_state[key] = to_raw(spec, spec.suggested)
            filled[key] = to_raw(spec, spec.suggested)
    seen[algorithm] = now


def filled_note(algorithm: str, name: str) -> str | None:
    """The note under a field the form filled in, while it still holds the filled value."""
    key = state.config_field_key(algorithm, name)
    filled = st.session_state.get(state.SETUP_FILLED, {})
    if key in filled and st.session_state.get(key) == filled[key]:
        return f"Filled in {filled[key]:g} because {name} is required in this mode; change it freely."
    return None


def overrides(algorithm: str, values: dict[str, Any]) -> dict[str, Any]:
    """The values that differ from the config class's defaults: what a spec file stores."""
    specs = field_specs(config_class(algorithm))
    return {name: value for name, value in values.items() if name in specs and value != specs[name].default}


def offending_field(message: str, names: Iterable[str]) -> str | None:
    """The field a validation message is about: the config field named first in it (longest name on a tie)."""
    best: tuple[int, int, str] | None = None
    for name in names:
        match = re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message)
        if match:
            key = (match.start(), -len(name), name)
            best = key if best is None or key < best else best
    return best[2] if best else None


def validate(algorithm: str, config_overrides: dict[str, Any], num_agents: int) -> tuple[Any | None, list[FieldError]]:
    """Build the config as the Python API does; on failure, CoMLRL's message for every field that fails.

    The config stops at its first error, so each failing field in turn is put back to its default (or, when the
    default is refused too, its suggested value) and the config built again, until it builds or a field fails
    a third time: every error shows at once.
    """
    cls = config_class(algorithm)
    specs = field_specs(cls)
    visible = [n for n in specs if n not in HIDDEN_FIELDS or n == "num_agents"]
    trial = dict(config_overrides)
    errors: list[FieldError] = []
    tries: dict[str | None, int] = {}
    for _ in range(2 * len(specs)):
        try:
            config = cls(**{**trial, "num_agents": int(num_agents)})
        except (ValueError, TypeError) as exc:
            message = str(exc)
            name = offending_field(message, visible)
            tries[name] = tries.get(name, 0) + 1
            if tries[name] == 1:
                errors.append(FieldError(name, message))
            if name is None or name == "num_agents":
                break
            if tries[name] == 1 and name in trial:
                trial.pop(name)
            elif tries[name] <= 2 and specs[name].suggested is not None:
                trial[name] = specs[name].suggested
            else:
                break
        else:
            return (config if not errors else None), errors
    return None, errors


def load_config_into_state(algorithm: str, config: dict[str, Any]) -> list[str]:
    """Put a spec's config overrides into the widgets of ``algorithm``; returns messages about skipped keys."""
    specs = field_specs(config_class(algorithm))
    notes = []
    for name, spec in specs.items():
        if name in HIDDEN_FIELDS:
            continue
        key = state.config_field_key(algorithm, name)
        value = config.get(name, spec.default)
        raw = to_raw(spec, value)
        if spec.kind == "choice" and raw not in spec.choices:
            notes.append(f"{name}: {value!r} is not one of {', '.join(spec.choices)}; kept the default")
            raw = _raw_default(spec)
        if spec.kind == "multichoice" and not set(raw) <= set(spec.choices):
            notes.append(f"{name}: {value!r} lists names other than {', '.join(spec.choices)}; kept the default")
            raw = _raw_default(spec)
        if spec.kind == "int" and raw is not None and (isinstance(raw, bool) or not isinstance(raw, int)):
            notes.append(f"{name}: {value!r} is not an integer; kept the default")
            raw = _raw_default(spec)
        if spec.kind == "float" and raw is not None and not isinstance(raw, float):
            notes.append(f"{name}: {value!r} is not a number; kept the default")
            raw = _raw_default(spec)
        if spec.kind == "bool" and not isinstance(raw, bool):
            notes.append(f"{name}: {value!r} is not true/false; kept the default")
            raw = _raw_default(spec)
        st.session_state[key] = raw
    for name in sorted(set(config) - set(specs)):
        if name != "num_agents":
            notes.append(f"{name}: not a field of {config_class(algorithm).__name__}; ignored")
    return notes


# ------------------------------------------------------------------------------------------------------------
# Drawing fields


def _float_step(default: Any) -> float:
    if isinstance(default, (int, float)) and not isinstance(default, bool) and default:
        return float(10 ** math.floor(math.log10(abs(float(default)))))
    return 0.01


def _tooltip(spec: FieldSpec) -> str:
    default = "None" if spec.default is None else repr(spec.default)
    return f"{spec.help}\n\nDefault: `{default}`"


def start_optional_number(key: str, base: Any) -> None:
    """Give an optional number box its start value (call before the widget).

    Streamlit lets a number box be emptied only when its widget was made with ``value=None``; made with a
    number, emptying it snaps back. So an optional box is always made with ``value=None`` and its start value goes
    in through the session state.
    """
    if key not in st.session_state and base is not None:
        st.session_state[key] = base


def render_field(algorithm: str, spec: FieldSpec, errors: Sequence[FieldError] = ()) -> None:
    """One config field's widget, with CoMLRL's validation message under it when the field is an offending one.

    The widget's default is always the field's start value (``base_config_value``), the value the URL's draft
    is written against.
    """
    key = state.config_field_key(algorithm, spec.name)
    label = spec.name
    help_text = _tooltip(spec)
    base = base_config_value(algorithm, spec)
    common: dict[str, Any] = {"key": key, "help": help_text, **KEEP}
    none_text = f"None = {spec.none_means}" if spec.none_means else "None"
    if spec.kind in ("int", "float"):
        if spec.optional:
            start_optional_number(key, base)
        number: dict[str, Any] = {"value": None if spec.optional else base, "placeholder": none_text}
        if spec.kind == "int":
            st.number_input(label, step=1, format="%d", **number, **common)
        else:
            st.number_input(label, step=_float_step(spec.default), format="%g", **number, **common)
    elif spec.kind == "bool":
        st.toggle(label, value=bool(base), **common)
    elif spec.kind == "choice":
        options = list(spec.choices)
        st.selectbox(label, options, index=options.index(base) if base in options else 0, **common)
    elif spec.kind == "multichoice":
        st.multiselect(label, list(spec.choices), default=base, placeholder="None", **common)
    elif spec.kind == "json":
        st.text_area(label, value=base, placeholder='None, or a JSON object such as {"k": "v"}', height=80, **common)
    else:
        placeholders = {
            "devices": "None = automatic; or cpu, cuda:0, or a comma-separated list",
            "list": "None; or comma-separated model ids / paths",
            "text": none_text if spec.optional else "",
        }
        st.text_input(label, value=base, placeholder=placeholders[spec.kind], **common)
    note = filled_note(algorithm, spec.name)
    if note:
        st.caption(note)
    for error in errors:
        if error.field == spec.name:
            st.error(error.message, icon=":material/error:")


def render_fields(algorithm: str, names: Sequence[str], errors: Sequence[FieldError], *, columns: int = 3) -> list[str]:
    """Draw the named fields that ``algorithm``'s config has and that apply to its modes; returns the names drawn."""
    specs = field_specs(config_class(algorithm))
    values, _ = current_values(algorithm)
    present = [n for n in names if n in specs and n not in HIDDEN_FIELDS and applies(algorithm, specs[n], values)]
    for start in range(0, len(present), columns):
        cols = st.columns(columns)
        for col, name in zip(cols, present[start : start + columns]):
            with col:
                render_field(algorithm, specs[name], errors)
    return present


def grouped_fields(algorithm: str) -> list[tuple[str, str, list[str]]]:
    """The "Algorithm settings" groups that apply to ``algorithm`` (fields shown elsewhere left out)."""
    specs = field_specs(config_class(algorithm))
    shown_elsewhere = set(ESSENTIALS) | set(COMPARATOR_FIELDS) | set(API_FIELDS) | set(REPLAY_FIELDS) | HIDDEN_FIELDS
    by_group: dict[str, list[str]] = {title: [] for title in GROUP_CAPTIONS}
    for name, spec in specs.items():
        if name not in shown_elsewhere:
            by_group.setdefault(spec.group, []).append(name)
    return [(title, GROUP_CAPTIONS.get(title, ""), names) for title, names in by_group.items() if names]


# ------------------------------------------------------------------------------------------------------------
# Agents and task: the parts of the spec that are not config fields

AGENT_SOURCES = ("Embedded tiny model", "Local path", "Hub id")
TASK_KINDS = ("Built-in task", "Your own task module")


def agents_section(max_agents: int = MAX_AGENTS) -> tuple[list[str], list[str]]:
    """Agent count and one model per agent. Returns (model ids/paths, problems)."""
    n = st.number_input(
        "Number of agents",
        min_value=1,
        max_value=max_agents,
        step=1,
        key=state.SETUP_NUM_AGENTS,
        **KEEP,
        help="One policy per agent role; the task's formatters give each agent its own prompt.",
        value=base_setup_value(state.SETUP_NUM_AGENTS),
    )
    models: list[str] = []
    problems: list[str] = []
    for i in range(int(n)):
        left, right = st.columns([2, 3], vertical_alignment="bottom")
        with left:
            source = st.segmented_control(
                f"Agent {i + 1} model",
                AGENT_SOURCES,
                key=state.agent_source_key(i),
                **KEEP,
                required=True,
                help="The embedded tiny model needs no network; a local path is a save_pretrained folder; a hub id "
                "loads from the Hugging Face cache or the hub.",
                default=AGENT_SOURCES[0],
            )
        with right:
            if source == AGENT_SOURCES[0]:
                with st.container(key=state.agent_tiny_key(i)):
                    st.markdown(f"`{TINY_MODEL_NAME}` · embedded 1M-parameter Llama, loads offline")
                models.append(TINY_MODEL_NAME)
            else:
                placeholder = (
                    "/path/to/model (save_pretrained folder)" if source == AGENT_SOURCES[1] else "org/model-name"
                )
                value = st.text_input(
                    f"Agent {i + 1} model",
                    key=state.agent_model_key(i),
                    **KEEP,
                    placeholder=placeholder,
                    label_visibility="collapsed",
                ).strip()
                if not value:
                    problems.append(f"Agent {i + 1}: enter a {'path' if source == AGENT_SOURCES[1] else 'hub id'}.")
                elif source == AGENT_SOURCES[1] and not Path(value).expanduser().exists():
                    problems.append(f"Agent {i + 1}: {value} does not exist.")
                models.append(value)
    return models, problems


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
            min_value=1,
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
            min_value=1,
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


def start_session() -> tuple[str, list[str]] | None:
    """At a session's first Setup run: ("draft", notes) when the URL brings back a draft, ("preset", []) when it
    does not; at later runs None.

    The form starts from the session's preset (``session_preset``) in both cases; a draft in the URL holds only
    its differences from it (``read_draft_from_url``).
    """
    if state.SETUP_PRESET in st.session_state:
        return None
    st.session_state[state.SETUP_PRESET] = PRESET_QUICKSTART
    if not any(key in draft_fields() for key in st.query_params):
        return "preset", []
    return "draft", read_draft_from_url()


def load_spec_into_state(spec: ExperimentSpec) -> list[str]:
    """Fill every Setup widget from a spec (a loaded file or a past run); returns notes about skipped values."""
    row = algorithm_row(spec.algorithm)
    st.session_state[state.SETUP_FAMILY] = row.family
    st.session_state[state.SETUP_ITERATIVE] = row.iterative
    st.session_state[state.SETUP_NUM_AGENTS] = len(spec.agent_models)
    for i, model in enumerate(spec.agent_models):
        if is_tiny_model_name(model):
            st.session_state[state.agent_source_key(i)] = AGENT_SOURCES[0]
        else:
            local = Path(model).expanduser().exists() or model.startswith((".", "/", "~"))
            st.session_state[state.agent_source_key(i)] = AGENT_SOURCES[1] if local else AGENT_SOURCES[2]
            st.session_state[state.agent_model_key(i)] = model
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


def field_names_in(names: Iterable[str], errors: Sequence[FieldError]) -> bool:
    return any(e.field in set(names) for e in errors)
