"""Word-level differences between a winner and a loser response, as HTML-escaped markup for side-by-side view.

``difflib.SequenceMatcher`` aligns the two texts as sequences of words and whitespace; words only in the
winner are marked as added on the winner's side, words only in the loser as removed on the loser's side.
Every piece of model text is HTML-escaped before it is wrapped, so a completion can never inject markup.
Pure functions; nothing here imports Streamlit.
"""

from __future__ import annotations

import difflib
import html
import re

_TOKEN = re.compile(r"\s+|\w+|[^\w\s]")

ADDED_STYLE = "background-color: rgba(22, 163, 74, 0.22); border-radius: 3px; padding: 0 1px;"
REMOVED_STYLE = "background-color: rgba(220, 38, 38, 0.20); border-radius: 3px; padding: 0 1px; text-decoration: line-through; text-decoration-color: rgba(220, 38, 38, 0.6);"
BOX_STYLE = (
    "white-space: pre-wrap; word-break: break-word; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; "
    "font-size: 0.88rem; line-height: 1.45; padding: 0.6rem 0.75rem; border-radius: 0.5rem; "
    "border: 1px solid rgba(128, 128, 128, 0.35); min-height: 2.6rem;"
)


def tokenize(text: str) -> list[str]:
    """Words, runs of whitespace and single punctuation marks; joining them gives ``text`` back."""
    return _TOKEN.findall(text or "")


def word_diff(winner: str, loser: str) -> tuple[list[tuple[str, bool]], list[tuple[str, bool]]]:
    """Segments of each text as (text, differs): the winner's and the loser's, aligned word by word."""
    a, b = tokenize(winner), tokenize(loser)
    matcher = difflib.SequenceMatcher(a=a, b=b, autojunk=False)
    left: list[tuple[str, bool]] = []
    right: list[tuple[str, bool]] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            left.append(("".join(a[i1:i2]), False))
            right.append(("".join(b[j1:j2]), False))
            continue
        if i2 > i1:
            left.append(("".join(a[i1:i2]), True))
        if j2 > j1:
            right.append(("".join(b[j1:j2]), True))
    return left, right


def _render(segments: list[tuple[str, bool]], style: str, marker: str) -> str:
    out = []
    for text, differs in segments:
        escaped = html.escape(text)
        if differs and text.strip():
            out.append(f'<span class="{marker}" style="{style}">{escaped}</span>')
        else:
            out.append(escaped)
    return "".join(out)


def diff_html(winner: str, loser: str) -> tuple[str, str]:
    """(winner HTML, loser HTML): words only in the winner highlighted green, only in the loser red."""
    left, right = word_diff(winner, loser)
    return _render(left, ADDED_STYLE, "diff-added"), _render(right, REMOVED_STYLE, "diff-removed")


def text_box(inner_html: str, *, label: str | None = None, empty: str = "(empty response)") -> str:
    """A bordered block holding already-escaped ``inner_html`` (an empty response is named, not blank)."""
    body = (
        inner_html
        if inner_html.strip()
        else f'<span style="opacity: 0.55; font-style: italic;">{html.escape(empty)}</span>'
    )
    head = (
        f'<div style="font-size: 0.8rem; opacity: 0.75; margin-bottom: 0.2rem;">{html.escape(label)}</div>'
        if label
        else ""
    )
    return f'{head}<div style="{BOX_STYLE}">{body}</div>'


def plain_html(text: str) -> str:
    return html.escape(text or "")


#: What ``similarity`` measures, for the help text beside it.
SIMILARITY_HELP = (
    "Words in common, in order: 2 × (words matched in order) / (the winner's words + the loser's words), with "
    "punctuation marks counted as words and spaces ignored. 100% = the same words; two 4-word answers that share "
    "3 words in the same places give 75%."
)


def similarity(winner: str, loser: str) -> float:
    """Words in common, in order (``SIMILARITY_HELP``): difflib's ratio over the words, whitespace left out."""
    a = [t for t in tokenize(winner) if not t.isspace()]
    b = [t for t in tokenize(loser) if not t.isspace()]
    if not a and not b:
        return 1.0
    return difflib.SequenceMatcher(a=a, b=b, autojunk=False).ratio()
