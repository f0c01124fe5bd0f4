"""Centralized comparator text: one prompt asking for every role, and the parser that splits the answer.

The tagged format follows CoMLRL's default adapter (reference 4.4) so prompts and parses match. Unlike CoMLRL,
an output without tags is not fatal: the caller marks that candidate unparsed, counts it and skips it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


class CentralizedComparatorParseError(ValueError):
    """A centralized completion had none of the ``<agent_i>`` sections."""


@runtime_checkable
class CentralizedComparatorAdapter(Protocol):
    def build_prompt(self, batch_item: dict, agent_prompts: Sequence[str]) -> str: ...

    def parse_completion(self, completion: str, batch_item: dict, num_agents: int) -> Sequence[str]: ...


class TaggedCentralizedComparatorAdapter:
    """``<agent_0>…</agent_0>`` sections, 0-based, case-insensitive, whitespace-tolerant tags."""

    def build_prompt(self, batch_item: dict, agent_prompts: Sequence[str]) -> str:
        count = len(agent_prompts)
        sections = "\n\n".join(f"Agent {i} original prompt:\n{prompt}" for i, prompt in enumerate(agent_prompts))
        formats = "\n".join(f"<agent_{i}>\n...\n</agent_{i}>" for i in range(count))
        return (
            f"You are a centralized coordinator producing the separate outputs of {count} agents.\n\n"
            "Each output must satisfy its corresponding original prompt. Keep the outputs separate;\n"
            "do not merge them or add commentary outside the required tags.\n\n"
            f"{sections}\n\nReturn exactly one section for each agent in this format:\n{formats}\n"
        )

    def parse_completion(self, completion: str, batch_item: dict, num_agents: int) -> list[str]:
        outputs, found = [], False
        for i in range(num_agents):
            match = _tag_pattern(i).search(completion)
            found = found or match is not None
            outputs.append(match.group(1).strip() if match else "")
        if not found:
            raise CentralizedComparatorParseError(
                f"centralized comparator output has no <agent_i> sections: {completion[:120]!r}"
            )
        return outputs


def _tag_pattern(index: int) -> re.Pattern[str]:
    return re.compile(
        rf"<\s*agent_{index}\s*>(.*?)<\s*/\s*agent_{index}\s*>",
        flags=re.IGNORECASE | re.DOTALL,
    )


def validate_adapter(adapter: Any) -> Any:
    for method in ("build_prompt", "parse_completion"):
        if not callable(getattr(adapter, method, None)):
            raise TypeError(f"centralized_comparator_adapter.{method} must be callable.")
    return adapter


def split_completion(adapter: Any, completion: str, batch_item: dict, num_agents: int) -> list[str] | None:
    """Per-role texts, or None when the completion cannot be parsed (marked unparsed by the caller)."""
    try:
        parts = adapter.parse_completion(completion, batch_item, num_agents)
    except ValueError:
        return None
    if isinstance(parts, str) or not isinstance(parts, Sequence) or len(parts) != num_agents:
        return None
    if not all(isinstance(p, str) for p in parts):
        return None
    return list(parts)
