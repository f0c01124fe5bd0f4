"""Prompt formatters: one callable per agent that turns a task item into that agent's prompt.

``resolve_formatters`` accepts what CoMLRL's trainers accept: None (each agent reads ``item["prompt"]``),
one callable shared by every agent, or a sequence with one callable per agent. Each resolved formatter
passes ``external_prompts=None`` to a user function that declares that keyword (CoMLRL's single-turn
call) and checks that the result is a string.

It does not tokenise, apply chat templates or cache prompts.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["MissingPromptError", "default_formatter", "format_prompts", "resolve_formatters"]


class MissingPromptError(ValueError, KeyError):
    """A task item has no ``"prompt"`` key and no formatter was given (both a ValueError and a KeyError)."""

    __str__ = ValueError.__str__  # KeyError's str() would quote the whole message


def default_formatter(item: Mapping[str, Any]) -> str:
    """CoMLRL's default: the item's ``"prompt"`` field."""
    try:
        prompt = item["prompt"]
    except KeyError:
        keys = ", ".join(repr(k) for k in item) if isinstance(item, Mapping) else type(item).__name__
        raise MissingPromptError(
            f"Task item has no 'prompt' key (keys: {keys or 'none'}). Add a 'prompt' field to the data or pass "
            "formatters that build each agent's prompt from the item."
        ) from None
    if not isinstance(prompt, str):
        raise TypeError(f"Task item's 'prompt' is {type(prompt).__name__}; prompts must be strings.")
    return prompt


class _Formatter:
    """A user formatter called CoMLRL's way, with a readable name and a type check on its result."""

    __slots__ = ("agent_index", "func", "pass_external_prompts")

    def __init__(self, func: Callable[..., Any], agent_index: int) -> None:
        self.func = func
        self.agent_index = agent_index
        self.pass_external_prompts = _accepts_external_prompts(func)

    def __call__(self, item: Mapping[str, Any]) -> str:
        if self.pass_external_prompts:
            prompt = self.func(item, external_prompts=None)
        else:
            prompt = self.func(item)
        if not isinstance(prompt, str):
            raise TypeError(
                f"Formatter {_name(self.func)} for agent {self.agent_index + 1} returned {type(prompt).__name__}; "
                "a formatter must return the prompt as a string."
            )
        return prompt

    @property
    def __name__(self) -> str:
        return _name(self.func)

    def __repr__(self) -> str:
        return f"<formatter {_name(self.func)} for agent {self.agent_index + 1}>"


def _name(func: Any) -> str:
    return str(getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or type(func).__name__)


def _accepts_external_prompts(func: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    if "external_prompts" in parameters:
        return parameters["external_prompts"].kind is not inspect.Parameter.POSITIONAL_ONLY
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def resolve_formatters(formatters: Any, num_agents: int) -> list[Callable[[Mapping[str, Any]], str]]:
    """One prompt formatter per agent, from None, one shared callable, or a sequence of ``num_agents``."""
    if isinstance(num_agents, bool) or not isinstance(num_agents, int) or num_agents < 1:
        raise ValueError(f"num_agents must be a positive integer, got {num_agents!r}.")
    if formatters is None:
        return [default_formatter] * num_agents
    if callable(formatters):
        return [_Formatter(formatters, i) for i in range(num_agents)]
    if isinstance(formatters, Sequence) and not isinstance(formatters, (str, bytes)):
        if len(formatters) != num_agents:
            raise ValueError("Number of formatters must match num_agents when providing a sequence.")
        resolved: list[Callable[[Mapping[str, Any]], str]] = []
        for i, func in enumerate(formatters):
            if not callable(func):
                raise ValueError(f"formatters[{i}] must be callable, got {type(func).__name__}.")
            resolved.append(func if isinstance(func, _Formatter) or func is default_formatter else _Formatter(func, i))
        return resolved
    raise ValueError(
        f"formatters must be None, a callable, or a sequence of {num_agents} callables; got {type(formatters).__name__}."
    )


def format_prompts(
    formatters: Sequence[Callable[[Mapping[str, Any]], str]], items: Sequence[Mapping[str, Any]]
) -> list[list[str]]:
    """Per-agent prompts for a batch of items: ``result[i][n] = formatters[i](items[n])``."""
    return [[formatter(item) for item in items] for formatter in formatters]
