"""View choices kept in the page's URL, so that a reload or a shared link comes back to the same view.

A page lists its keys (``UrlKey``: the session-state key, which is also the query parameter, how its value is
written, and its default). ``restore`` puts the URL's values into the session once per session and page, before
the widgets are drawn; ``keep`` writes the session's values back after every run, because Streamlit drops a page's
query on a page switch. Only values that differ from the default are written. A value the URL holds that cannot
be read, or that the page no longer offers (``drop_unknown``), is left out and named. The open run is
``state.sync_run_with_url``'s; the Setup draft is ``forms``'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import streamlit as st


def _pair(text: str) -> tuple[int, int]:
    first, _, second = text.partition(":")
    return int(first), int(second)


def _bool(text: str) -> bool:
    if text not in ("true", "false"):
        raise ValueError(f"{text!r} is not true or false")
    return text == "true"


#: kind -> (value to text, text to value); a list kind holds one query value per item.
CODECS: dict[str, tuple[Callable[[Any], str], Callable[[str], Any]]] = {
    "text": (str, str),
    "int": (str, int),
    "float": (repr, float),
    "bool": (lambda v: "true" if v else "false", _bool),
    "pair": (lambda v: f"{v[0]}:{v[1]}", _pair),  # (round, pair index)
    "list": (str, str),
}


@dataclass(frozen=True)
class UrlKey:
    """A widget's session-state key kept in the URL under the same name."""

    key: str
    kind: str = "text"
    default: Any = None

    def encode(self, value: Any) -> list[str]:
        to_text = CODECS[self.kind][0]
        return [to_text(v) for v in value] if self.kind == "list" else [to_text(value)]

    def decode(self, texts: list[str]) -> Any:
        from_text = CODECS[self.kind][1]
        return [from_text(t) for t in texts] if self.kind == "list" else from_text(texts[-1])


def restore(page: str, keys: Sequence[UrlKey]) -> tuple[set[str], list[str]]:
    """Put the URL's values of ``keys`` into the session, once per session on ``page`` (call before the widgets).

    Returns the keys read and a note per value that could not be read.
    """
    flag = f"{page}.url_read"
    if st.session_state.get(flag):
        return set(), []
    st.session_state[flag] = True
    read, notes = set(), []
    for spec in keys:
        texts = st.query_params.get_all(spec.key)
        if not texts:
            continue
        try:
            st.session_state[spec.key] = spec.decode(texts)
        except ValueError:
            notes.append(f"{spec.key}={texts[-1]!r} in the address could not be read; left at its default")
            continue
        read.add(spec.key)
    return read, notes


def drop_unknown(key: str, options: Sequence[Any]) -> str | None:
    """Take out of ``key``'s session value what ``options`` lacks (a round not run yet, a run since deleted); a note
    saying what went, or None."""
    value = st.session_state.get(key)
    if value is None:
        return None
    if isinstance(value, list):
        kept = [v for v in value if v in options]
        if len(kept) == len(value):
            return None
        st.session_state[key] = kept
        return f"{key}: {', '.join(map(str, (v for v in value if v not in options)))} no longer offered"
    if value in options:
        return None
    del st.session_state[key]
    return f"{key}: {value} no longer offered"


def keep(keys: Sequence[UrlKey]) -> None:
    """Write the session's values of ``keys`` to the URL (a value at its default is taken out of it)."""
    for spec in keys:
        value = st.session_state.get(spec.key, spec.default)
        wanted = [] if value == spec.default or value is None or value == [] else spec.encode(value)
        if st.query_params.get_all(spec.key) == wanted:
            continue
        if wanted:
            st.query_params[spec.key] = wanted if spec.kind == "list" else wanted[0]
        else:
            del st.query_params[spec.key]
