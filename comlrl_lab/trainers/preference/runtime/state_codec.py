"""A checkpoint's small state as data: JSON for the structure, safetensors for its tensors; nothing to unpickle.

``encode(state)`` returns a JSON-safe tree and the tensors it refers to by name; ``decode(tree, tensors)`` builds the
state again. Besides JSON's own types it knows tuples (Python ``random`` states), dicts with keys other than strings,
tensors (torch generator states) and the record dataclasses a trainer keeps between phases (``PreferencePair``,
``JointCandidate``). Any other type is refused when the state is written, so nothing is silently turned into text,
and nothing in a file can name a type or a function to call when it is read: a run folder shared by a colleague is
data, never code. It does not read or write files (``checkpoint.py`` does).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch

from comlrl_lab.data.records import JointCandidate, PreferencePair

_TUPLE = "__tuple__"
_ITEMS = "__items__"
_TENSOR = "__tensor__"
_RECORD = "__record__"
_FLOAT = "__float__"  # NaN and infinities, which strict JSON has no words for
#: The only classes a state may hold besides JSON's types; the name in the file picks one of these, nothing else.
RECORD_TYPES: dict[str, type] = {cls.__name__: cls for cls in (PreferencePair, JointCandidate)}
_MARKERS = (_TUPLE, _ITEMS, _TENSOR, _RECORD, _FLOAT)


class StateFormatError(ValueError):
    """A state file holds something this codec does not read (a tampered or foreign file)."""


def encode(state: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """(JSON-safe tree, tensors by name) for ``state``; ``TypeError`` naming the path of an unsupported value."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(value: Any, path: str) -> Any:
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {_FLOAT: repr(value)}
        if isinstance(value, torch.Tensor):
            name = f"t{len(tensors)}"
            tensors[name] = value.detach().cpu().contiguous().clone()
            return {_TENSOR: name}
        if isinstance(value, list):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {_TUPLE: [walk(v, f"{path}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, Mapping):
            if all(isinstance(k, str) and k not in _MARKERS for k in value):
                return {k: walk(v, f"{path}.{k}") for k, v in value.items()}
            return {_ITEMS: [[walk(k, path), walk(v, f"{path}[{k!r}]")] for k, v in value.items()]}
        if dataclasses.is_dataclass(value) and RECORD_TYPES.get(type(value).__name__) is type(value):
            fields = {f.name: walk(getattr(value, f.name), f"{path}.{f.name}") for f in dataclasses.fields(value)}
            return {_RECORD: type(value).__name__, "fields": fields}
        if hasattr(value, "item") and getattr(value, "shape", None) == ():  # numpy scalars
            return walk(value.item(), path)
        raise TypeError(f"checkpoint state {path or '<root>'}: cannot store a {type(value).__name__} without pickle")

    return walk(state, ""), tensors


def decode(tree: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """The state ``encode`` was given, rebuilt from its tree and tensors; ``StateFormatError`` for anything else."""

    def walk(value: Any) -> Any:
        if isinstance(value, list):
            return [walk(v) for v in value]
        if not isinstance(value, dict):
            return value
        if _TUPLE in value:
            return tuple(walk(v) for v in value[_TUPLE])
        if _ITEMS in value:
            return {_hashable(walk(k)): walk(v) for k, v in value[_ITEMS]}
        if _FLOAT in value:
            if value[_FLOAT] not in ("nan", "inf", "-inf"):
                raise StateFormatError(f"not a float: {value[_FLOAT]!r}")
            return float(value[_FLOAT])
        if _TENSOR in value:
            if value[_TENSOR] not in tensors:
                raise StateFormatError(f"the state refers to a tensor {value[_TENSOR]!r} that its tensor file lacks")
            return tensors[value[_TENSOR]]
        if _RECORD in value:
            cls = RECORD_TYPES.get(value[_RECORD])
            if cls is None:
                raise StateFormatError(f"unknown record type {value[_RECORD]!r}")
            known = {f.name for f in dataclasses.fields(cls)}
            fields = {k: walk(v) for k, v in dict(value.get("fields", {})).items()}
            if set(fields) - known:
                raise StateFormatError(f"{cls.__name__} has no fields {sorted(set(fields) - known)}")
            return cls(**fields)
        return {k: walk(v) for k, v in value.items()}

    return walk(tree)


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key
