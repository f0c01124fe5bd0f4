"""The Setup draft in the page's address: a reload or a shared link rebuilds the same form.

Every Setup widget starts from the value the form starts from (``forms.base_config_value``,
``forms.base_setup_value``: the quickstart preset, else CoMLRL's default). At the end of each run the page writes
the values that differ from it into the query (``write_draft_to_url``), keyed by widget key, as the field codec
spells them (``fields.encode``; a text box's own text; an emptied number box as an empty value). A new session
reads them back before any widget is drawn (``start_session``), through the same codec, and skips with a note what
a widget cannot hold. This module draws nothing.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from comlrl_lab.data.tasks import list_tasks
from comlrl_lab.models.tiny_model import TINY_MODEL_NAME
from comlrl_lab.trainers.preference.algorithms import FAMILIES
from comlrl_lab.trainers.preference.config import CONFIG_CLASSES, ConfigError, fields
from comlrl_lab.trainers.preference.config.fields import FieldSpec, field_specs
from comlrl_lab.ui import forms, model_picker, state


def _widget(key: str, kind: str, *, choices: tuple[str, ...] = (), optional: bool = False) -> FieldSpec:
    """A Setup widget that is not a config field, described for the codec (its options exactly as shown)."""
    return FieldSpec(key, kind, optional, metadata={"choices": choices, "exact": True} if choices else {})


def draft_widgets() -> dict[str, tuple[FieldSpec, Any]]:
    """Every Setup widget the draft may carry, by key, with its field spec and its start value: the agents, task
    and algorithm widgets, the run name, and every config field of every algorithm (each keeps its own values)."""
    text, number, choice = fields.TEXT, fields.INT, fields.CHOICE
    base = forms.base_setup_value
    setup = [
        (_widget(state.SETUP_NUM_AGENTS, number), base(state.SETUP_NUM_AGENTS)),
        (_widget(state.SETUP_TASK_KIND, choice, choices=forms.TASK_KINDS), forms.TASK_KINDS[0]),
        (_widget(state.SETUP_TASK, choice, choices=tuple(list_tasks())), base(state.SETUP_TASK)),
        (_widget(state.SETUP_USER_MODULE, text), ""),
        (_widget(state.SETUP_USER_TRAIN, text), ""),
        (_widget(state.SETUP_USER_EVAL, text), ""),
        (_widget(state.SETUP_FAMILY, choice, choices=FAMILIES), base(state.SETUP_FAMILY)),
        (_widget(state.SETUP_ITERATIVE, fields.BOOL), base(state.SETUP_ITERATIVE)),
        (_widget(state.SETUP_RUN_NAME, text), base(state.SETUP_RUN_NAME)),
        (_widget(state.SETUP_MAX_TRAIN_ITEMS, number, optional=True), base(state.SETUP_MAX_TRAIN_ITEMS)),
        (_widget(state.SETUP_MAX_EVAL_ITEMS, number, optional=True), base(state.SETUP_MAX_EVAL_ITEMS)),
    ]
    models = model_picker.options()
    for i in range(forms.MAX_AGENTS):
        setup.append((_widget(state.agent_source_key(i), choice, choices=models), TINY_MODEL_NAME))
        setup.append((_widget(state.agent_model_key(i), text), ""))
    out: dict[str, tuple[FieldSpec, Any]] = {spec.name: (spec, start) for spec, start in setup}
    for algorithm, cls in CONFIG_CLASSES.items():
        for name, spec in field_specs(cls).items():
            if name not in forms.HIDDEN_FIELDS:
                out[state.config_field_key(algorithm, name)] = (spec, forms.base_config_value(algorithm, spec))
    return out


def url_text(spec: FieldSpec, widget_value: Any) -> str:
    """A widget value as the URL spells it: a text box's own text, else the codec's text of its value."""
    if spec.kind in fields.TEXT_KINDS:
        return "" if widget_value is None else str(widget_value)
    return fields.encode(spec, forms.from_widget(spec, widget_value))


def widget_value(spec: FieldSpec, text: str) -> Any:
    """The widget value the URL's ``text`` spells; ``ConfigError`` when it spells no value the widget can hold."""
    value = forms.to_widget(spec, fields.decode(spec, text))
    if not forms.holds(spec, value):
        raise ConfigError(f"the form cannot hold {text!r}", field=spec.name, value=text)
    return value


def read_draft_from_url() -> list[str]:
    """Put the URL's draft into the session, before any Setup widget is drawn; returns notes about values skipped.

    Call once, at a session's first Setup run: later runs keep what the widgets hold.
    """
    widgets = draft_widgets()
    notes = []
    for key in st.query_params:
        if key not in widgets:
            continue
        text = st.query_params[key]
        try:
            st.session_state[key] = widget_value(widgets[key][0], text)
        except ConfigError as error:
            notes.append(f"{key}={text!r}: {error}")
    return notes


def write_draft_to_url() -> None:
    """Keep the URL's query on the draft: every Setup value that differs from its start value (call last).

    The whole draft is written from the session on every run, so a write that raced with another (the browser
    sends the next change while this run still works) is put right by the next run.
    """
    widgets = draft_widgets()
    wanted = {
        key: url_text(spec, st.session_state[key])
        for key, (spec, base) in widgets.items()
        if key in st.session_state and st.session_state[key] != base
    }
    present = {key: st.query_params[key] for key in st.query_params if key in widgets}
    if wanted == present:
        return
    for key in present.keys() - wanted.keys():
        del st.query_params[key]
    st.query_params.update({key: text for key, text in wanted.items() if present.get(key) != text})


def start_session() -> tuple[str, list[str]] | None:
    """At a session's first Setup run: ("draft", notes) when the URL brings back a draft, ("preset", []) when it
    does not; at later runs None.

    The form starts from the session's preset (``forms.session_preset``) in both cases; a draft in the URL holds
    only its differences from it (``read_draft_from_url``).
    """
    if state.SETUP_PRESET in st.session_state:
        return None
    st.session_state[state.SETUP_PRESET] = forms.PRESET_QUICKSTART
    if not any(key in draft_widgets() for key in st.query_params):
        return "preset", []
    return "draft", read_draft_from_url()
