"""What each config field is, and its one text <-> value codec: derived from the field's type and metadata.

``field_specs(config_class)`` describes every field as a ``FieldSpec``: its kind (from the type annotation, or
``choice`` / ``multichoice`` from the metadata), whether None is allowed, its default, help, choices with their
aliases and notes, its group, and when it applies. ``encode`` and ``decode`` turn a value into text and back; every
place where text becomes a field value uses them: the Setup form's text boxes and its URL draft, ``comlrl-lab run
--set`` and ``sweep --grid``, ``benchmarks/learning.py --set`` and the strings of a YAML or JSON spec file.
``decode`` refuses text that spells no value of the field with a ``ConfigError`` naming the field; whether a value
is allowed is the config's to say (a choice is checked by the config's own ``choose``).

``applies`` says whether a field means anything under the other fields' values (``applies_when``);
``inapplicable_to_default`` and ``suggestions`` are the one rule for the fields a choice brings along: a field
that does not apply takes its default, and one that applies but is empty starts from its ``suggested`` value (the
Setup form and a sweep's grid cells both follow it). ``collect_errors`` builds a config and reports every refused
field at once, as the Setup form shows them.

This module imports neither torch nor Streamlit: the CLI, the engine and the benchmarks use it as the UI does.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from comlrl_lab.trainers.preference.config import (
    CONFIG_CLASSES,
    ConfigError,
    check_field_names,
    choose,
    resolve,
)

__all__ = [
    "FieldSpec",
    "applies",
    "collect_errors",
    "decode",
    "decode_strings",
    "encode",
    "field_specs",
    "fields_in_group",
    "inapplicable_to_default",
    "overrides",
    "parse_assignment",
    "suggestions",
]

BOOL, INT, FLOAT, CHOICE, MULTICHOICE = "bool", "int", "float", "choice", "multichoice"
#: Kinds whose widget holds text: a plain string, one item or a list (devices, modules), a list, a JSON object.
TEXT, ONE_OR_LIST, LIST, JSON = "text", "one_or_list", "list", "json"
TEXT_KINDS = (TEXT, ONE_OR_LIST, LIST, JSON)

_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
_NONE = ("", "none", "null")


@dataclass(frozen=True)
class FieldSpec:
    """One field as the form, the codec and the docs see it.

    ``metadata`` is the field's own (``choices``, ``aliases``, ``refusal``, ...); a Setup widget that is not a config
    field (the task, the algorithm family) gets a spec with just its ``choices`` there.
    """

    name: str
    kind: str
    optional: bool = False
    default: Any = None
    help: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @property
    def choices(self) -> tuple[str, ...]:
        return tuple(self.metadata.get("choices", ()) or self.metadata.get("multi_choices", ()))

    @property
    def group(self) -> str:
        return self.metadata.get("group", "")

    @property
    def applies_when(self) -> Mapping[str, tuple[str, ...]]:
        """Controlling field -> the values under which this field means something."""
        return self.metadata.get("applies_when", {})

    @property
    def suggested(self) -> Any:
        """The value the form fills in when the field becomes required and is empty."""
        return self.metadata.get("suggested")

    @property
    def none_means(self) -> str:
        """What None stands for, shown in an empty box."""
        return self.metadata.get("none_means", "")

    @property
    def choice_help(self) -> Mapping[str, str]:
        """A note per choice (what that value does)."""
        return self.metadata.get("choice_help", {})

    @property
    def symbol(self) -> str:
        """The paper's name of the value (k, λ), for short labels."""
        return self.metadata.get("symbol", self.name)


def _kind(hint: Any, metadata: Mapping[str, Any]) -> tuple[str, bool]:
    args = typing.get_args(hint)
    optional = type(None) in args
    if "choices" in metadata:
        return CHOICE, optional
    if "multi_choices" in metadata:
        return MULTICHOICE, optional
    arms = {typing.get_origin(a) or a for a in (args or (hint,)) if a is not type(None)}
    for kind, types in ((BOOL, {bool}), (INT, {int}), (FLOAT, {float}), (ONE_OR_LIST, {str, list})):
        if arms == types:
            return kind, optional
    if dict in arms:
        return JSON, optional
    if list in arms:
        return LIST, optional
    return TEXT, optional


@functools.cache
def field_specs(config_class: type) -> dict[str, FieldSpec]:
    """Every field of ``config_class`` in declaration order."""
    hints = typing.get_type_hints(config_class)
    specs: dict[str, FieldSpec] = {}
    for f in fields(config_class):
        kind, optional = _kind(hints[f.name], f.metadata)
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        specs[f.name] = FieldSpec(f.name, kind, optional, default, f.metadata["help"], f.metadata)
    return specs


def fields_in_group(group: str) -> tuple[str, ...]:
    """Every config field whose group is ``group``, in declaration order across the configs."""
    names: dict[str, None] = {}
    for cls in CONFIG_CLASSES.values():
        names.update((name, None) for name, spec in field_specs(cls).items() if spec.group == group)
    return tuple(names)


# -- the codec -------------------------------------------------------------------------------------------------


def _plain(items: list[str]) -> bool:
    """Items a comma-separated text gives back as they are."""
    return all(item and item == item.strip() and "," not in item for item in items) and not (
        items and items[0].startswith("[")
    )


def encode(spec: FieldSpec, value: Any) -> str:
    """``value`` as text that ``decode`` reads back to the same value (None is the empty text)."""
    if value is None:
        return ""
    if spec.kind == BOOL:
        return "true" if value else "false"
    if spec.kind == FLOAT and not isinstance(value, bool):
        return repr(float(value))
    if spec.kind == JSON:
        return json.dumps(value, ensure_ascii=False)
    if spec.kind in (MULTICHOICE, LIST, ONE_OR_LIST) and not isinstance(value, str):
        items = [str(v) for v in value]
        # One item of a one-or-list field reads back as a plain string, and an empty list as None: write those
        # (and items with commas) as JSON.
        one_is_ambiguous = spec.kind == ONE_OR_LIST and len(items) == 1
        return ", ".join(items) if items and _plain(items) and not one_is_ambiguous else json.dumps(items)
    return str(value)


def decode(spec: FieldSpec, text: str) -> Any:
    """The value ``text`` spells for field ``spec``; a ``ConfigError`` naming the field when it spells none.

    Empty text, ``none`` and ``null`` are None where None is allowed; a choice may be any spelling the config
    accepts (an alias, another case) and comes back canonical; a list is comma-separated or a JSON list.
    """
    text = str(text)
    stripped = text.strip()
    if spec.kind == CHOICE:
        if spec.metadata.get("checked") is False:  # CoMLRL keeps unknown names of such a field as given
            return resolve(spec.metadata, stripped) or stripped
        return choose(spec.name, spec.metadata, stripped if spec.metadata.get("exact") else text)
    if spec.optional and (stripped.lower() in _NONE if spec.kind != MULTICHOICE else not stripped):
        return None
    if spec.kind == BOOL:
        if stripped.lower() in _TRUE + _FALSE:
            return stripped.lower() in _TRUE
        raise ConfigError(f"{text!r} is not a bool (true or false)", field=spec.name, value=text)
    if spec.kind == INT:
        try:
            return int(stripped)
        except ValueError:
            raise ConfigError(f"{text!r} is not an int", field=spec.name, value=text) from None
    if spec.kind == FLOAT:
        try:
            value = float(stripped)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise ConfigError(f"{text!r} is not a finite number", field=spec.name, value=text)
        return value
    if spec.kind == JSON:
        try:
            value = json.loads(stripped)
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"{text!r} is not a JSON object ({error.msg} at column {error.colno})", field=spec.name, value=text
            ) from None
        if not isinstance(value, dict):
            raise ConfigError(f"{text!r} is not a JSON object", field=spec.name, value=text)
        return value
    if spec.kind == TEXT:
        return text
    items = _items(spec, text, stripped)
    if spec.kind == MULTICHOICE:
        return [item.lower() for item in items]
    return items[0] if spec.kind == ONE_OR_LIST and len(items) == 1 and not stripped.startswith("[") else items


def _items(spec: FieldSpec, text: str, stripped: str) -> list[str]:
    if not stripped.startswith("["):
        return [part.strip() for part in stripped.split(",") if part.strip()]
    try:
        value = json.loads(stripped)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{text!r} is not a JSON list of strings", field=spec.name, value=text)
    return value


def parse_assignment(config_class: type, text: str) -> tuple[str, Any]:
    """``"FIELD=VALUE"`` -> (field, value): an unknown field is refused with the closest name, the value decoded."""
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ValueError(f"expected FIELD=VALUE, got {text!r}")
    check_field_names(config_class, [name])
    return name, decode(field_specs(config_class)[name], raw)


def decode_strings(config_class: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with every string that spells a value of a non-text field decoded (YAML reads ``1e-3`` as text);
    a string that spells none is kept as given, for the config to refuse with its own message."""
    specs = field_specs(config_class)
    out = dict(values)
    for name, value in values.items():
        spec = specs.get(name)
        if spec is None or spec.kind == TEXT or not isinstance(value, str):
            continue
        with contextlib.suppress(ConfigError):
            out[name] = decode(spec, value)
    return out


# -- applicability, defaults, every error at once ---------------------------------------------------------------


def applies(specs: Mapping[str, FieldSpec], name: str, values: Mapping[str, Any]) -> bool:
    """Whether field ``name`` means something under ``values`` (its ``applies_when``); a controlling field absent
    from ``values`` does not rule it out."""
    for controller, allowed in specs[name].applies_when.items():
        if controller in values and resolve(specs[controller].metadata, values[controller]) not in allowed:
            return False
    return True


def inapplicable_to_default(specs: Mapping[str, FieldSpec], values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with every field that does not apply under the others (a k without nearest_k, a λ without
    lambda_decay) put back to its default, so a value meant for another mode never blocks the config."""
    out = dict(values)
    for name in out:
        if name in specs and not applies(specs, name, out):
            out[name] = specs[name].default
    return out


def suggestions(specs: Mapping[str, FieldSpec], values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``suggested`` value of every field that a choice in ``values`` needs and nobody set: it applies (its
    ``applies_when``), it is empty, and it has one (k 2 under nearest_k, λ 0.5 under lambda_decay)."""
    return {
        name: spec.suggested
        for name, spec in specs.items()
        if spec.suggested is not None
        and spec.applies_when
        and values.get(name, spec.default) is None
        and applies(specs, name, values)
    }


def overrides(config_class: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """The values that differ from the config class's defaults: what a spec file stores."""
    specs = field_specs(config_class)
    return {name: value for name, value in values.items() if name in specs and value != specs[name].default}


def collect_errors(config_class: type, values: Mapping[str, Any]) -> tuple[Any | None, list[ConfigError]]:
    """Build the config; on failure, the ``ConfigError`` of every field that fails.

    The config stops at its first error, so each failing field in turn is put back to its default (or, when the
    default is refused too, its suggested value) and the config built again, until it builds or a field fails a
    third time. ``num_agents`` is not put back (the caller owns it).
    """
    specs = field_specs(config_class)
    trial = dict(values)
    errors: list[ConfigError] = []
    tries: dict[str, int] = {}
    for _ in range(2 * len(specs)):
        try:
            config = config_class(**trial)
        except ConfigError as error:
            name = error.field
            tries[name] = tries.get(name, 0) + 1
            if tries[name] == 1:
                errors.append(error)
            if name == "num_agents" or name not in specs:
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
