"""YAML and JSON spec text read with bounds: alias expansion and nesting depth, each refused with the file and line.

PyYAML shares an aliased node instead of copying it, so ``yaml.safe_load`` of an anchor bomb (nine levels of nine
aliases) returns at once; it is writing the spec back out (``spec.json``, the store's config) that expands it into
gigabytes. Its composer also recurses once per nesting level, so 100,000 nested ``[`` give a ``RecursionError`` with
no file or line. ``load_yaml`` composes the document while counting the values it would hold once every alias is
expanded (at most ``MAX_VALUES``) and its depth (at most ``MAX_DEPTH``), and raises ``SpecBoundError`` at the node
that passed a bound, before any value is built. ``check_depth`` bounds the depth of parsed JSON the same way. This
module does not check what the values mean (the config does; ``spec_file.py`` locates its errors).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

#: Values in a spec once aliases are expanded: a large spec has a few hundred.
MAX_VALUES = 100_000
#: Nesting levels: a spec has three or four (config -> comparator_api_headers -> name).
MAX_DEPTH = 64


class SpecBoundError(ValueError):
    """A spec passed a bound; the message names the file, line and column."""


class _BoundedLoader(yaml.SafeLoader):
    """A SafeLoader whose composer counts expanded values and depth as it goes."""

    def __init__(self, stream: str, path: Path):
        super().__init__(stream)
        self._path = path
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> values it holds, aliases expanded
        self._total = 0

    def _refuse(self, what: str, mark: Any) -> SpecBoundError:
        where = f"{self._path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(self._path)
        return SpecBoundError(f"{where}: {what}")

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = super().compose_node(parent, index)
            self._count(self._sizes.get(id(node), 1), event.start_mark)
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise self._refuse(f"the spec is nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
        before = self._total
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._count(1, node.start_mark)
        self._sizes[id(node)] = self._total - before
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        # PyYAML keeps the last of a key given twice; a spec refuses it (which one did the author mean?). Keys a
        # merge (<<) brings in may be overridden, as YAML intends: only the keys written in the mapping count.
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, (str, int, float, bool)) or key is None:
                    if key in seen:
                        first = seen[key].line + 1
                        raise self._refuse(
                            f"the key {key!r} is given twice in one mapping (first at line {first}); give it once",
                            key_node.start_mark,
                        )
                    seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)

    def _count(self, values: int, mark: Any) -> None:
        self._total += values
        if self._total > MAX_VALUES:
            raise self._refuse(
                f"the spec holds more than {MAX_VALUES:,} values once its YAML aliases are expanded (an alias bomb?)",
                mark,
            )


def load_yaml(text: str, path: str | Path) -> Any:
    """``yaml.safe_load(text)`` within the bounds; ``SpecBoundError`` names ``path`` and the line."""
    loader = _BoundedLoader(text, Path(path))
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def refuse_duplicate_keys(text: str, path: str | Path) -> Any:
    """``json.loads`` hook (``object_pairs_hook``) that refuses a key given twice in one object, naming the file and
    the lines where the key is written."""
    import re

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                pattern = re.compile(rf'"{re.escape(key)}"\s*:')
                lines = [str(text.count("\n", 0, m.start()) + 1) for m in pattern.finditer(text)]
                where = f" (written at lines {', '.join(lines)})" if lines else ""
                raise SpecBoundError(f"{path}: the key {key!r} is given twice in one object{where}; give it once")
            out[key] = value
        return out

    return hook


def check_depth(data: Any, path: str | Path) -> None:
    """Refuse parsed data (JSON) nested deeper than ``MAX_DEPTH``, without recursion."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SpecBoundError(f"{path}: the spec is nested deeper than {MAX_DEPTH} levels")
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        stack.extend((child, depth + 1) for child in children)
