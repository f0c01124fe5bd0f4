"""What every config shares: ``ConfigError``, the field metadata lookups, choice resolution and the checks
the configs' ``__post_init__`` run; the constants several fields default to."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any

from comlrl_lab.trainers.preference.config import credentials

# rl_algorithm decides the advantage baseline of the MAGRPO family; actor-critic leaves advantage_mode alone.
MAGRPO_FAMILY_ADVANTAGE_MODE: dict[str, str] = {
    "magrpo": "mean",
    "mareinforce": "raw",
    "maremax": "max",
    "marloo": "rloo",
}

#: What the labelling view shows above each comparison unless the spec says otherwise (label_guideline).
DEFAULT_LABEL_GUIDELINE = (
    "Read the prompt(s), then both joint responses: every agent's part together. Choose A or B for the joint "
    "response that better does what the prompt asks, tie when neither is better, both bad when neither is "
    "acceptable. Judge the responses, not their length; skip when unsure."
)
#: The placeholders judge_template must contain.
JUDGE_PLACEHOLDERS: tuple[str, ...] = ("{prompt}", "{response_a}", "{response_b}")
DEFAULT_JUDGE_TEMPLATE = (
    "You compare two joint responses of a team of agents to the same task.\n\n"
    "Task:\n{prompt}\n\n"
    "Response A:\n{response_a}\n\n"
    "Response B:\n{response_b}\n\n"
    "Which response better does what the task asks? Answer with one of: A, B, tie, both bad. "
    "Begin your answer with it."
)
SECRET_FIELDS: frozenset[str] = frozenset({"comparator_api_key"})
#: The API comparator's settings mean something only for comparator_policy="api".
_API_ONLY: dict[str, tuple[str, ...]] = {"comparator_policy": ("api",)}
MASK = credentials.MASK


class ConfigError(ValueError):
    """A value a config (or an experiment spec) refuses. ``str(error)`` is the message, CoMLRL's word for word
    where CoMLRL has one; ``field`` names the field it is about, ``value`` holds the value refused (None when the
    field was left empty) and ``suggestion`` a close spelling, when there is one."""

    def __init__(self, message: str, *, field: str, value: Any = None, suggestion: str | None = None):
        super().__init__(message)
        self.field = field
        self.value = value
        self.suggestion = suggestion

    def __reduce__(self) -> tuple:
        # Exceptions pickle as cls(*args); the keyword-only attributes travel as state.
        return (_config_error, (str(self), self.field), {"value": self.value, "suggestion": self.suggestion})


def _config_error(message: str, field: str) -> ConfigError:
    return ConfigError(message, field=field)


def _clean(value: Any) -> str:
    return "" if value is None else str(value).strip().lower()


def _metadata(config_class: type, name: str) -> Mapping[str, Any]:
    return config_class.__dataclass_fields__[name].metadata


def field_choices(config_class: type, name: str) -> tuple[str, ...]:
    """The canonical values of field ``name`` in ``config_class`` (``metadata["choices"]``); () for a free field."""
    return tuple(_metadata(config_class, name).get("choices", ()))


def field_aliases(config_class: type, name: str) -> dict[str, str]:
    """Alias -> canonical value of field ``name`` (``metadata["aliases"]``); the canonical names are not repeated."""
    return dict(_metadata(config_class, name).get("aliases", {}))


def field_multi_choices(config_class: type, name: str) -> tuple[str, ...]:
    """The values a list field such as ``report_to`` may hold (``metadata["multi_choices"]``); () for others."""
    return tuple(_metadata(config_class, name).get("multi_choices", ()))


def resolve(metadata: Mapping[str, Any], value: Any) -> str | None:
    """The canonical value ``value`` spells among ``metadata``'s choices (lower-cased and trimmed, an alias counts;
    as written for an ``"exact"`` field), else None."""
    if metadata.get("exact"):
        return value if isinstance(value, str) and value in metadata["choices"] else None
    key = _clean(value)
    if key in metadata["choices"]:
        return key
    return metadata.get("aliases", {}).get(key)


def choose(name: str, metadata: Mapping[str, Any], value: Any) -> str:
    """The canonical value ``value`` spells, or the ``ConfigError`` that refuses it: CoMLRL's wording
    (``metadata["refusal"]``, by default "must be one of"), or for a field marked ``"suggest"`` one that lists the
    accepted names and aliases and suggests the closest spelling."""
    canonical = resolve(metadata, value)
    if canonical is not None:
        return canonical
    choices = tuple(metadata["choices"])
    if not metadata.get("suggest"):
        template = metadata.get("refusal", "{name} must be one of: {choices}.")
        message = template.format(name=name, choices=", ".join(choices), alternatives=" or ".join(choices))
        raise ConfigError(message, field=name, value=value)
    aliases = list(metadata.get("aliases", {}))
    close = difflib.get_close_matches(_clean(value), [*choices, *aliases], n=1)
    hint = f"; did you mean {close[0]!r}?" if close else "."
    raise ConfigError(
        f"{name} {value!r} is not one of: {', '.join(choices)} (aliases: {', '.join(aliases)}){hint}",
        field=name,
        value=value,
        suggestion=close[0] if close else None,
    )


def resolve_choice(config_class: type, name: str, value: Any) -> str | None:
    """The canonical value ``value`` spells for field ``name`` of ``config_class`` (``resolve``), else None."""
    return resolve(_metadata(config_class, name), value)


def check_choice(config_class: type, name: str, value: Any) -> str:
    """The canonical value ``value`` spells for field ``name`` of ``config_class``, else its ``ConfigError``."""
    return choose(name, _metadata(config_class, name), value)


def check_field_names(config_class: type, names: Iterable[str]) -> None:
    """Refuse names that are not fields of ``config_class``: a ``ConfigError`` about the first, with the closest
    field name as its suggestion."""
    known = [f.name for f in fields(config_class)]
    unknown = [name for name in names if name not in known]
    if not unknown:
        return
    close = difflib.get_close_matches(str(unknown[0]), known, n=1, cutoff=0.6)
    if len(unknown) > 1:
        message = f"{config_class.__name__} has no fields {', '.join(repr(n) for n in unknown)}."
    else:
        message = f"{config_class.__name__} has no field {unknown[0]!r}" + (
            f"; did you mean {close[0]!r}?" if close else ""
        )
    raise ConfigError(message, field=unknown[0], suggestion=close[0] if close else None)


def _choose(config: Any, name: str) -> str:
    """Resolve field ``name`` of ``config`` in place (``check_choice``)."""
    canonical = check_choice(type(config), name, getattr(config, name))
    setattr(config, name, canonical)
    return canonical


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _check_int_at_least(
    name: str, value: Any, minimum: int, *, optional: bool = False, says_null: bool = False
) -> None:
    """``says_null``: the message ends "or null.", as CoMLRL words it for the optional fields it checks."""
    if value is None and optional:
        return
    if not _is_int(value):
        raise ConfigError(f"{name} must be an integer, got {value!r}.", field=name, value=value)
    if value < minimum:
        raise ConfigError(f"{name} must be >= {minimum}{' or null' if says_null else ''}.", field=name, value=value)


def _check_positive(name: str, value: Any, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not _is_number(value) or not value > 0:
        raise ConfigError(f"{name} must be > 0.", field=name, value=value)


def field_bound(config_class: type, name: str) -> Mapping[str, Any] | None:
    """The bound ``name`` declares in its metadata (an integer's ``minimum``, a number's closed interval ``minimum`` to
    ``maximum``, or ``exclusive_minimum`` for a number that must be above it; ``bound_allows_none`` and
    ``bound_says_null`` for optional fields), from the class that declares it first: a subclass
    that only changes a default keeps its base's bound. None for a field without one."""
    for klass in reversed(config_class.__mro__):
        declared = getattr(klass, "__dataclass_fields__", {}).get(name)
        if declared is not None and ("minimum" in declared.metadata or "exclusive_minimum" in declared.metadata):
            return declared.metadata
    return None


def check_bound(config: Any, name: str) -> None:
    """Refuse ``config.name`` outside the bound its metadata declares, in CoMLRL's words where it has them."""
    bound = field_bound(type(config), name)
    value = getattr(config, name)
    if "maximum" in bound:  # a closed interval of numbers
        low, high = bound["minimum"], bound["maximum"]
        if not _is_number(value) or not low <= value <= high:
            raise ConfigError(f"{name} must be in [{low}, {high}].", field=name, value=value)
    elif "minimum" in bound:
        _check_int_at_least(
            name,
            value,
            bound["minimum"],
            optional=bound.get("bound_allows_none", False),
            says_null=bound.get("bound_says_null", False),
        )
    else:
        _check_positive(name, value, optional=bound.get("bound_allows_none", False))


def _quoted_alternatives(values: tuple[str, ...]) -> str:
    """CoMLRL's list of modes in a message: 'a', 'b', or 'c'."""
    quoted = [repr(v) for v in values]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])}, or {quoted[-1]}"


def _check_dependent(config: Any, name: str, controller: str) -> bool:
    """CoMLRL's rules for field ``name``, which applies only under some values of ``controller`` (its
    ``applies_when``, marked ``"strict"``): set where it does not apply, it is refused (a ``"tolerated"`` value
    aside); ``"required"``, it must be set where it applies. True when it applies and is set, for the caller to
    check its value."""
    metadata = _metadata(type(config), name)
    allowed = tuple(metadata["applies_when"][controller])
    mode, value = getattr(config, controller), getattr(config, name)
    if mode in allowed:
        if value is None and metadata.get("required"):
            raise ConfigError(f"{name} is required when {controller}={mode!r}.", field=name)
        return value is not None
    if value is None:
        return False
    tolerated = metadata.get("tolerated", {})
    if mode in tolerated:
        accepted = tolerated[mode]
        if not (type(value) is type(accepted) and value == accepted):
            raise ConfigError(
                f"{name} must be null or {accepted!r} when {controller}={mode!r}.", field=name, value=value
            )
        return False
    when = f"{controller}={allowed[0]!r}" if len(allowed) == 1 else f"{controller} is {_quoted_alternatives(allowed)}"
    raise ConfigError(f"{name} is only valid when {when}.", field=name, value=value)


def dependents(config_class: type, controller: str) -> list[str]:
    """The fields of ``config_class`` whose ``applies_when`` names ``controller``, in declaration order."""
    return [f.name for f in fields(config_class) if controller in f.metadata.get("applies_when", {})]


def _jsonable(value: Any, path: str, name: str) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_jsonable(item, f"{path}[{i}]", name) for i, item in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, f"{path}[{k!r}]", name) for k, v in value.items()}
    # comparator_agents may hold model objects: keep the id they were loaded from, which loads them again.
    model_id = getattr(value, "name_or_path", None) or getattr(getattr(value, "config", None), "_name_or_path", None)
    if isinstance(model_id, str) and model_id:
        return model_id
    raise ConfigError(
        f"{path} holds a {type(value).__name__} without a model id, so the config cannot be serialised.", field=name
    )
