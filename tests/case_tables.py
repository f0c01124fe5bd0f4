"""Table-driven fault tests (test_hostile.py, test_bad_input.py): a case, its parametrisation, and the table check."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Case:
    """One finding: the issue's item and a few words, and the function ``case_<name>`` that checks it."""

    issue: str
    check: Callable[..., None]
    marks: tuple = ()

    @property
    def name(self) -> str:
        return self.check.__name__.removeprefix("case_")


def case_params(cases: list[Case]) -> list:
    """``cases`` as pytest parameters, each with its marks and its name as the id."""
    return [pytest.param(c, marks=c.marks, id=c.name) for c in cases]


def run_case(case: Case, request) -> None:
    """Call the case's check with the fixtures its parameters name."""
    case.check(**{name: request.getfixturevalue(name) for name in inspect.signature(case.check).parameters})


def check_table(cases: list[Case], module_globals: dict, separate: dict[str, str]) -> None:
    """Every case once, every ``case_`` function in the table, and every separate test defined."""
    names = [c.name for c in cases]
    assert len(names) == len(set(names))
    own = module_globals["__name__"]  # the test module's own case_ functions, not what it imported
    defined = {
        n for n, obj in module_globals.items() if n.startswith("case_") and getattr(obj, "__module__", "") == own
    }
    assert defined == {c.check.__name__ for c in cases}
    assert all(name in module_globals for name in separate.values())
