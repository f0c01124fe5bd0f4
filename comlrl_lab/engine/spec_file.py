"""Spec files as text: YAML or JSON parsed with syntax errors at their line and column, and a refusal placed at the
line of the key it is about.

``parse_spec_text`` turns the text into a mapping (``SpecError`` for a syntax error, located, or for a file that
holds no mapping); ``located`` turns a ``ConfigError`` (which names its field) into a ``SpecError`` at that field's
line. It knows nothing of what a spec holds: ``spec.py`` reads the mapping.
"""

from __future__ import annotations

import json
import re

from comlrl_lab.trainers.preference.config import ConfigError


class SpecError(ValueError):
    """A mistake in an experiment spec: ``file:line: what, and what was meant``."""


def key_line(text: str, key: str) -> int | None:
    """The 1-based line where ``key`` is first written as a mapping key (YAML or JSON), or None."""
    pattern = re.compile(rf"""(^|[{{,\s])["']?{re.escape(key)}["']?\s*:""", re.MULTILINE)
    found = pattern.search(text)
    return None if found is None else text.count("\n", 0, found.start() + len(found.group(1))) + 1


def _at(source: str, line: int | None) -> str:
    return f"{source}:{line}" if line else source


def parse_spec_text(text: str, source: str) -> dict:
    """The mapping a spec file holds (YAML for a ``.yaml``/``.yml`` source, else JSON); ``SpecError`` naming
    ``source`` and, for a syntax error, its line and column."""
    from comlrl_lab.engine.bounded_yaml import (
        MAX_DEPTH,
        SpecBoundError,
        check_depth,
        load_yaml,
        refuse_duplicate_keys,
    )

    if source.lower().endswith((".yaml", ".yml")):
        import yaml

        try:
            data = load_yaml(text, source)
        except SpecBoundError as error:
            raise SpecError(str(error)) from None
        except yaml.MarkedYAMLError as error:
            mark = error.problem_mark or error.context_mark
            where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
            raise SpecError(f"{where}: YAML syntax error: {error.problem or error.context}") from None
        except yaml.YAMLError as error:
            raise SpecError(f"{source}: YAML error: {error}") from None
    else:
        try:
            data = json.loads(text, object_pairs_hook=refuse_duplicate_keys(text, source))
            check_depth(data, source)
        except json.JSONDecodeError as error:
            raise SpecError(f"{source}:{error.lineno}:{error.colno}: JSON syntax error: {error.msg}") from None
        except RecursionError:
            raise SpecError(f"{source}: the spec is nested deeper than {MAX_DEPTH} levels") from None
        except SpecBoundError as error:
            raise SpecError(str(error)) from None
    if not isinstance(data, dict):
        raise SpecError(f"{source}: an experiment spec must be a mapping of keys, got {type(data).__name__}")
    return data


def located(source: str, text: str, error: ConfigError, *, fallback_key: str | None = None) -> SpecError:
    """``error`` as ``source:line: message`` at the line of its field, else of ``fallback_key`` (the mapping that
    holds the field: a required field is missing from the text), else without a line."""
    line = key_line(text, error.field)
    if line is None and fallback_key is not None:
        line = key_line(text, fallback_key)
    return SpecError(f"{_at(source, line)}: {error}")
