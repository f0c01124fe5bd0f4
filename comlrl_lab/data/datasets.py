"""Task items from Python objects or files: a list of dicts, a ``datasets.Dataset``, JSONL, JSON or CSV.

Every source becomes a ``list[dict]`` in file order, as CoMLRL's batch-1, unshuffled DataLoader reads it.
Bad input raises ``ValueError`` naming the file and the line (JSONL, CSV) or item (JSON); a missing file
raises ``FileNotFoundError``. CSV values stay strings (no type guessing), so a reward function that compares
numbers converts them itself.

It neither shuffles, splits nor formats prompts (that is ``formatters``), and never imports ``datasets`` or
torch: a Hugging Face ``Dataset`` is read through its ``to_list()`` / indexing methods.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["DATA_FILE_SUFFIXES", "load_items", "require_prompt_key"]

#: File suffixes ``load_items`` reads.
DATA_FILE_SUFFIXES: tuple[str, ...] = (".jsonl", ".ndjson", ".json", ".csv")


def load_items(source: Any) -> list[dict[str, Any]]:
    """Read task items from ``source`` and return them as a non-empty list of dicts, in order.

    ``source`` may be a list or tuple of dicts, any indexable sequence of dicts (a ``datasets.Dataset``),
    a pandas DataFrame, or a path (``str`` / ``os.PathLike``) to a ``.jsonl``, ``.json`` or ``.csv`` file.
    A ``.json`` file holds a list of objects or ``{"data": [...]}`` / ``{"items": [...]}``.
    """
    if isinstance(source, (str, os.PathLike)):
        return _load_file(Path(source))
    if isinstance(source, Mapping):
        keys = ", ".join(repr(k) for k in list(source)[:5])
        raise ValueError(
            f"Expected a sequence of task items (dicts), got a mapping with keys {keys}. "
            "For a DatasetDict pick a split, e.g. dataset['train']."
        )
    if hasattr(source, "columns") and callable(getattr(source, "to_dict", None)):  # pandas DataFrame
        rows = source.to_dict(orient="records")
        return _checked(rows, where="dataframe row")
    to_list = getattr(source, "to_list", None)
    if callable(to_list) and not isinstance(source, (list, tuple)):  # datasets.Dataset: one columnar read
        return _checked(to_list(), where="dataset item")
    if isinstance(source, Sequence) or (hasattr(source, "__len__") and hasattr(source, "__getitem__")):
        return _checked([source[i] for i in range(len(source))], where="item")
    if isinstance(source, Iterable) and not isinstance(source, (bytes, bytearray)):
        return _checked(list(source), where="item")
    raise ValueError(
        f"Cannot read task items from {type(source).__name__}: give a list of dicts, a datasets.Dataset, "
        "or a path to a .jsonl, .json or .csv file."
    )


def require_prompt_key(items: Sequence[Mapping[str, Any]], *, source: str | None = None) -> None:
    """Check that every item has a ``"prompt"`` key, which the default formatter (no formatters) reads."""
    for index, item in enumerate(items):
        if "prompt" not in item:
            where = f"{source}: " if source else ""
            keys = ", ".join(repr(k) for k in item) or "none"
            raise ValueError(
                f"{where}item {index} has no 'prompt' key (keys: {keys}). Without formatters each item must "
                "carry its prompt under 'prompt'; otherwise pass formatters that build prompts from the item."
            )


def _checked(rows: Sequence[Any], *, where: str) -> list[dict[str, Any]]:
    if not rows:
        raise ValueError("The dataset is empty: at least one task item is needed.")
    items: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ValueError(f"{where} {index}: expected a dict (one task item), got {type(row).__name__}.")
        items.append(dict(row))
    return items


def _load_file(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise FileNotFoundError(f"Data file not found: {path}")
    if path.is_dir():
        raise ValueError(f"{path} is a directory; expected a .jsonl, .json or .csv file.")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        items = _read_jsonl(path)
    elif suffix == ".json":
        items = _read_json(path)
    elif suffix == ".csv":
        items = _read_csv(path)
    else:
        raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use .jsonl, .json or .csv.")
    if not items:
        raise ValueError(f"{path}: the file holds no task items.")
    return items


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    with path.open(encoding="utf-8-sig") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(
                    f"{path} line {line_number}: not valid JSON ({exc.msg} at column {exc.colno})."
                ) from exc
            if not isinstance(row, dict):
                raise ValueError(f"{path} line {line_number}: expected a JSON object, got {_json_type(row)}.")
            items.append(row)
    return items


def _read_json(path: Path) -> list[dict[str, Any]]:
    try:
        payload = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} line {exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno}).") from exc
    if isinstance(payload, dict):
        for key in ("data", "items"):
            if isinstance(payload.get(key), list):
                payload = payload[key]
                break
        else:
            raise ValueError(f'{path}: expected a list of objects or {{"data": [...]}} / {{"items": [...]}}.')
    if not isinstance(payload, list):
        raise ValueError(f"{path}: expected a list of objects, got {_json_type(payload)}.")
    for index, row in enumerate(payload):
        if not isinstance(row, dict):
            raise ValueError(f"{path} item {index}: expected a JSON object, got {_json_type(row)}.")
    return payload


def _read_csv(path: Path) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    with path.open(encoding="utf-8-sig", newline="") as handle:
        reader = csv.reader(handle)
        try:
            header = next(reader)
        except StopIteration:
            raise ValueError(f"{path}: the file is empty; expected a header row.") from None
        except csv.Error as exc:
            raise ValueError(f"{path} line {reader.line_num}: not valid CSV ({exc}).") from exc
        names = [name.strip() for name in header]
        if not any(names):
            raise ValueError(f"{path} line 1: the header row is empty.")
        if any(not name for name in names):
            raise ValueError(f"{path} line 1: the header has an empty column name.")
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"{path} line 1: duplicate column names {duplicates}.")
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                raise ValueError(f"{path} line {reader.line_num}: not valid CSV ({exc}).") from exc
            if not row:
                continue  # blank line
            if len(row) != len(names):
                raise ValueError(
                    f"{path} line {reader.line_num}: {len(row)} fields, but the header has {len(names)} columns."
                )
            items.append(dict(zip(names, row)))
    return items


def _json_type(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")
