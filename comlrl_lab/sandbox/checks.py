"""Splits a problem's test code into counted, individually guarded steps that the sandbox runs one by one.

HumanEval's ``test`` field defines ``check(candidate)``, a run of ``assert`` statements (a few problems wrap
asserts in a ``for`` loop after some set-up lines). To report "tests passed / total" rather than pass/fail, each
top-level statement of ``check`` that holds an ``assert`` (other than a constant one such as ``assert True``)
becomes one counted test; the other statements (imports, assignments) are set-up steps, not counted. Test code
with no ``check`` function (MBPP-style lines such as ``assert f(2) == 4``) is split the same way.

This module only parses (``ast``, in the trusted process) and writes source: it executes nothing. The source it
writes defines ``__sandbox_check__(candidate, __sandbox_step__)``, which wraps every step in its own
``try``/``except BaseException`` so one failure, ``SystemExit`` included, does not stop the rest; the launcher's
harness supplies ``__sandbox_step__``, which arms the per-test timer and records each outcome. The statements
keep ``check``'s local scope, so set-up lines and loops behave as in the original function.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache

CHECK_FUNCTION = "__sandbox_check__"
_STEP, _ERROR = "__sandbox_step__", "__sandbox_error__"


@dataclass(frozen=True)
class CheckSuite:
    """A problem's tests ready for the sandbox: ``source`` defines the guarded check, ``total`` tests counted."""

    source: str
    total: int
    entry_point: str


def _is_counted_test(statement: ast.stmt) -> bool:
    """A statement holding an ``assert`` whose condition is not a constant (``assert True`` checks nothing)."""
    return any(isinstance(n, ast.Assert) and not isinstance(n.test, ast.Constant) for n in ast.walk(statement))


def _guarded(statement: ast.stmt, index: int) -> list[ast.stmt]:
    """``step.begin(); try: <statement> except BaseException as e: step.end(index, e) else: step.end(index, None)``."""

    def end(arg: ast.expr) -> ast.stmt:
        call = ast.Call(ast.Attribute(ast.Name(_STEP, ast.Load()), "end", ast.Load()), [ast.Constant(index), arg], [])
        return ast.Expr(call)

    begin = ast.Expr(ast.Call(ast.Attribute(ast.Name(_STEP, ast.Load()), "begin", ast.Load()), [], []))
    handler = ast.ExceptHandler(ast.Name("BaseException", ast.Load()), _ERROR, [end(ast.Name(_ERROR, ast.Load()))])
    return [begin, ast.Try([statement], [handler], [end(ast.Constant(None))], [])]


def _module_guard(statement: ast.stmt) -> ast.stmt:
    """A module-level line of the test file (``METADATA = {...}``), kept from aborting the rest if it fails."""
    return ast.Try([statement], [ast.ExceptHandler(ast.Name("BaseException", ast.Load()), None, [ast.Pass()])], [], [])


@lru_cache(maxsize=1024)
def split_check(test_source: str, entry_point: str) -> CheckSuite:
    """The ``CheckSuite`` of ``test_source``; ``ValueError`` when it does not parse or holds no test."""
    try:
        tree = ast.parse(test_source)
    except SyntaxError as exc:
        raise ValueError(f"the test code does not parse (line {exc.lineno}: {exc.msg})") from None
    check = next(
        (
            node
            for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name == "check" and len(node.args.args) == 1
        ),
        None,
    )
    if check is not None:
        module_lines = [node for node in tree.body if node is not check]
        body, parameter = check.body, check.args.args[0].arg
    else:
        module_lines, body, parameter = [], tree.body, "candidate"
    # Differs from CoMLRL's code suite: it ran each `assert ... candidate ...` line alone, so asserts inside a loop
    # failed on the loop's names; here each top-level statement is a step in check's own scope.
    steps: list[ast.stmt] = []
    total = 0
    for statement in body:
        if _is_counted_test(statement):
            steps += _guarded(statement, total)
            total += 1
        else:
            steps += _guarded(statement, -1)
    if total == 0:
        raise ValueError("the test code holds no assert to count")
    # A parsed template rather than ast.FunctionDef(...): the node's fields differ between Python versions.
    function = ast.parse(f"def {CHECK_FUNCTION}({parameter}, {_STEP}):\n    pass").body[0]
    function.body = steps
    module = ast.Module([*(_module_guard(s) for s in module_lines), function], [])
    return CheckSuite(source=ast.unparse(ast.fix_missing_locations(module)), total=total, entry_point=entry_point)
