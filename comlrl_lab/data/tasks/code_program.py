"""Reads two agents' code completions and joins them into one program, with the static facts the reward needs.

Agent 1 writes a helper ``aux``, agent 2 the problem's entry point, which may call it. From each completion this
module takes the code (the contents of its fenced blocks, or the raw text), keeps the top-level definitions,
imports and assignments (prose and top-level calls dropped), and joins them after the problem prompt's own
imports and helper functions. It then answers, from the syntax tree alone: is each function defined with a
``return`` of a value, does the joined program parse, does the entry point call ``aux``, is it only a thin
wrapper around ``aux``, does it call ``aux`` and drop the result.

Everything here is parsing (``ast``) and text: it never executes a completion. Running the program is the
sandbox's job (``comlrl_lab.sandbox``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache

AUX_NAME = "aux"
_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_CODE_LANGUAGES = ("", "python", "py", "python3")
_KEPT_NODES = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AnnAssign,
)
# The first line of a kept chunk when the code does not parse as a whole (a definition, an import, a decorator
# or a plain assignment such as ``VOWELS = "aeiou"``).
_CHUNK_START = re.compile(r"(?:async\s+def|def|class)\s|(?:import|from)\s|@|[A-Za-z_]\w*\s*(?::[^=]*)?=(?!=)")


def extract_code(completion: str) -> str:
    """The code in a completion: its fenced blocks (python or unlabelled) joined, else the whole text."""
    blocks = [body for language, body in _FENCE.findall(completion) if language.lower() in _CODE_LANGUAGES]
    return "\n\n".join(blocks) if blocks else completion


def _node_lines(lines: list[str], node: ast.stmt) -> str:
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return "\n".join(lines[first - 1 : node.end_lineno])


def top_level_chunks(code: str) -> list[str]:
    """The definitions, imports and assignments of ``code``, one source chunk each, in order.

    When the code parses, the chunks are its kept top-level statements. When it does not (prose between
    functions, a truncated answer), a chunk is a line starting at column 0 plus the indented lines after it, kept
    when that first line starts a definition, import, decorator or assignment; a chunk that fails to parse on its
    own is kept too, so the joined program then fails to parse, as it should.
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return _line_chunks(code)
    lines = code.splitlines()
    return [_node_lines(lines, node) for node in tree.body if isinstance(node, _KEPT_NODES)]


def _line_chunks(code: str) -> list[str]:
    chunks: list[list[str]] = []
    for line in code.splitlines():
        if line.strip() and not line[0].isspace():
            chunks.append([line])
        elif chunks:
            chunks[-1].append(line)
    kept: list[str] = []
    pending_decorators: list[str] = []
    for chunk in chunks:
        text = "\n".join(chunk).rstrip()
        if not _CHUNK_START.match(chunk[0]):
            pending_decorators = []
        elif chunk[0].startswith("@"):
            pending_decorators.append(text)
        else:
            kept.append("\n".join([*pending_decorators, text]))
            pending_decorators = []
    return kept


def _function_node(chunk: str, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    try:
        tree = ast.parse(chunk)
    except (SyntaxError, ValueError):
        return None
    node = tree.body[0] if len(tree.body) == 1 else None
    return node if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name else None


_DEF_LINE = r"(?m)^(?:@.*\n)*(?:async\s+)?def\s+{name}\s*\("


def _defines(chunk: str, name: str) -> bool:
    return re.match(_DEF_LINE.format(name=re.escape(name)), chunk) is not None


def _own_nodes(function: ast.AST):
    """The function's body without the bodies of functions, lambdas and classes defined inside it."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def returns_a_value(chunk: str, name: str) -> bool:
    """``chunk`` defines ``name`` with a ``return <value>`` in its own body (textually, when it does not parse)."""
    node = _function_node(chunk, name)
    if node is not None:
        return any(isinstance(n, ast.Return) and n.value is not None for n in _own_nodes(node))
    return re.search(r"(?m)^[ \t]+return[ \t]+\S", chunk) is not None


def _calls_aux(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == AUX_NAME


def _contains_aux_call(node: ast.AST) -> bool:
    return any(_calls_aux(n) for n in ast.walk(node))


def _is_wrapper(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """The body, docstring aside, only returns an expression that calls ``aux``, directly or through one name."""
    body = list(function.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if len(body) == 1:
        return isinstance(body[0], ast.Return) and body[0].value is not None and _contains_aux_call(body[0].value)
    if len(body) == 2:
        first, second = body
        return (
            isinstance(first, ast.Assign)
            and len(first.targets) == 1
            and isinstance(first.targets[0], ast.Name)
            and _contains_aux_call(first.value)
            and isinstance(second, ast.Return)
            and isinstance(second.value, ast.Name)
            and second.value.id == first.targets[0].id
        )
    return False


@lru_cache(maxsize=1024)
def prompt_preamble(prompt: str, entry_point: str) -> tuple[str, ...]:
    """What the problem statement itself provides: its imports, constants and helper functions, not the stub.

    HumanEval/10, /32, /38 and /50 define a helper in the prompt that the solution or the tests call. Cached: every
    candidate of an item shares it.
    """
    try:
        tree = ast.parse(prompt)
    except (SyntaxError, ValueError):
        # A prose prompt (MBPP): only lines that are imports on their own.
        return tuple(line for line in prompt.splitlines() if re.match(r"(?:import|from)\s+\w", line) and _parses(line))
    lines = prompt.splitlines()
    return tuple(
        _node_lines(lines, node)
        for node in tree.body
        if isinstance(node, _KEPT_NODES)
        and not (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry_point)
    )


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class JointProgram:
    """The joined program of one joint response and what its syntax says (no execution)."""

    source: str
    defined_aux: bool
    defined_main: bool
    parses: bool
    uses_aux: bool
    wrapper: bool
    dropped_result: bool


def join_program(aux_completion: str, main_completion: str, prompt: str, entry_point: str) -> JointProgram:
    """Join agent 1's ``aux`` and agent 2's entry point after the prompt's preamble, and read the levels' facts.

    A definition of ``aux`` in agent 2's completion is dropped, so agent 2 cannot replace its partner's helper.
    The last definition of a name wins, as when Python runs the file.
    """
    aux_chunks = top_level_chunks(extract_code(aux_completion))
    # Differs from CoMLRL's code suite: there agent 2's own `def aux` came last and replaced agent 1's helper.
    main_chunks = [c for c in top_level_chunks(extract_code(main_completion)) if not _defines(c, AUX_NAME)]
    aux_defs = [c for c in aux_chunks if _defines(c, AUX_NAME)]
    main_defs = [c for c in main_chunks if _defines(c, entry_point)]
    defined_aux = bool(aux_defs) and returns_a_value(aux_defs[-1], AUX_NAME)
    defined_main = bool(main_defs) and returns_a_value(main_defs[-1], entry_point)
    # Differs from CoMLRL's code suite: it kept the prompt's imports only (and preset `math`), so the helpers that
    # HumanEval/10, /32, /38 and /50 define in the prompt were missing; here the prompt's definitions come first.
    source = "\n\n".join([*prompt_preamble(prompt, entry_point), *aux_chunks, *main_chunks]) + "\n"
    parses = _parses(source)
    main = _function_node(main_defs[-1], entry_point) if main_defs and parses else None
    return JointProgram(
        source=source,
        defined_aux=defined_aux,
        defined_main=defined_main,
        parses=parses,
        uses_aux=main is not None and any(_calls_aux(n) for n in ast.walk(main)),
        wrapper=main is not None and _is_wrapper(main),
        dropped_result=main is not None
        and any(isinstance(n, ast.Expr) and _calls_aux(n.value) for n in ast.walk(main)),
    )
