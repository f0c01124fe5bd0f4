"""The humaneval task: items and splits, prompts, code extraction, the level arithmetic worked out by hand, known
answers on the real sandbox, MBPP-style items as a user task, and hostile programs driven through the reward.

Every program here runs through ``TASK.reward_func`` / ``TASK.reward_details`` and so in the sandbox, never in
the test process. The hostile cases run under each isolation this host has (the best one, and rlimits alone as a
host without namespaces gets) and assert what that mode says it enforces; what a mode reports as not enforced is
asserted to be reported.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from comlrl_lab.data.tasks import get_task, list_tasks, list_word_tasks
from comlrl_lab.data.tasks import humaneval as he
from comlrl_lab.data.tasks.code_program import extract_code, join_program, top_level_chunks
from comlrl_lab.data.user_tasks import load_user_task
from comlrl_lab.sandbox import SandboxLimits, sandbox_capabilities

TASK = get_task("humaneval")
ROOT = Path(__file__).resolve().parents[1]

# HumanEval/0 with a helper that does the real work, and the entry point using it in four ways.
AUX_GAP = "def aux(numbers):\n    s = sorted(numbers)\n    return min((b - a for a, b in zip(s, s[1:])), default=float('inf'))\n"
MAIN_USES = "def has_close_elements(numbers, threshold):\n    gap = aux(numbers)\n    return gap < threshold\n"
MAIN_WRAPS = "def has_close_elements(numbers, threshold):\n    return aux(numbers) < threshold\n"
MAIN_DROPS = (
    "def has_close_elements(numbers, threshold):\n    aux(numbers)\n    s = sorted(numbers)\n"
    "    return any(b - a < threshold for a, b in zip(s, s[1:]))\n"
)
MAIN_WRONG = "def has_close_elements(numbers, threshold):\n    return False\n"
MAIN_BROKEN = "def has_close_elements(numbers, threshold):\n    return (numbers\n"
AUX_IDLE = "def aux(x):\n    return x\n"


@pytest.fixture(scope="module")
def problem0():
    return TASK.eval_items()[0]


# -- items, splits and prompts ---------------------------------------------------------------------------------


def test_registered_as_a_built_in_code_task():
    assert "humaneval" in list_tasks() and "humaneval" not in list_word_tasks()
    assert TASK.num_agents == 2 and TASK.reward_range == (0.0, 4.0) == TASK.reward_func.reward_range
    assert TASK.reward_func.supports_batch is True


def test_splits_are_the_anchors_slices_with_humanevals_fields():
    train, evaluation = TASK.train_items(), TASK.eval_items()
    assert [i["task_id"] for i in evaluation] == [f"HumanEval/{n}" for n in range(32)]
    assert [i["task_id"] for i in train] == [f"HumanEval/{n}" for n in range(33, 163)]
    assert all(set(item) == set(he.FIELDS) for item in train + evaluation)
    assert len(he.load_problems()) == 164
    train[0]["prompt"] = "changed"
    assert TASK.train_items()[0]["prompt"] != "changed"


def test_each_agent_is_told_what_it_writes(problem0):
    aux_prompt, main_prompt = TASK.prompts(problem0)
    for prompt in (aux_prompt, main_prompt):
        assert problem0["prompt"].strip() in prompt and "`has_close_elements`" in prompt
    assert aux_prompt.startswith("You are agent 1 of 2") and "one function named `aux`" in aux_prompt
    assert main_prompt.startswith("You are agent 2 of 2") and "do not define `aux` yourself" in main_prompt


# -- reading completions (parsing only) ------------------------------------------------------------------------


def test_code_comes_from_fenced_blocks_or_the_raw_text():
    fenced = "Here it is:\n```python\ndef aux(x):\n    return x\n```\nAnd a test:\n```\nprint(1)\n```\n```text\nno\n```"
    assert extract_code(fenced) == "def aux(x):\n    return x\n\n\nprint(1)\n"
    assert extract_code("```py\ndef f():\n    return 1") == "def f():\n    return 1"  # cut off at max tokens
    assert extract_code("def f():\n    return 1\n") == "def f():\n    return 1\n"


def test_prose_and_top_level_calls_are_dropped_definitions_kept():
    code = (
        "import math\nHere is my function:\n@staticmethod\ndef f(x):\n    return math.sqrt(x)\n"
        "It works because...\nprint(f(4))\nLIMIT = 3\n"
    )
    assert top_level_chunks(code) == ["import math", "@staticmethod\ndef f(x):\n    return math.sqrt(x)", "LIMIT = 3"]
    parsed = "import os\ndef g():\n    return 1\nprint(g())\nif __name__ == '__main__':\n    g()\n"
    assert top_level_chunks(parsed) == ["import os", "def g():\n    return 1"]


def test_agent_2_cannot_replace_agent_1s_helper(problem0):
    main = "def aux(numbers):\n    return 0\n\n" + MAIN_USES
    program = join_program(AUX_GAP, main, problem0["prompt"], problem0["entry_point"])
    assert program.source.count("def aux(") == 1 and "sorted(numbers)" in program.source
    assert program.source.startswith("from typing import List\n")  # the prompt's own import comes first


@pytest.mark.parametrize(
    ("main", "facts"),
    [
        (MAIN_USES, dict(uses_aux=True, wrapper=False, dropped_result=False)),
        (MAIN_WRAPS, dict(uses_aux=True, wrapper=True, dropped_result=False)),
        (
            'def has_close_elements(numbers, threshold):\n    """Doc."""\n    r = aux(numbers) < threshold\n    return r\n',
            dict(uses_aux=True, wrapper=True, dropped_result=False),
        ),  # fmt: skip
        (MAIN_DROPS, dict(uses_aux=True, wrapper=False, dropped_result=True)),
        (
            "def has_close_elements(numbers, threshold):\n    # aux(numbers) would help\n    return False\n",
            dict(uses_aux=False, wrapper=False, dropped_result=False),
        ),  # fmt: skip
    ],
)
def test_uses_aux_wrapper_and_dropped_result_read_from_the_syntax_tree(problem0, main, facts):
    program = join_program(AUX_GAP, main, problem0["prompt"], problem0["entry_point"])
    assert program.defined_aux and program.defined_main and program.parses
    assert {k: getattr(program, k) for k in facts} == facts


def test_a_function_without_a_returned_value_is_not_defined(problem0):
    program = join_program("def aux(x):\n    print(x)\n", MAIN_WRONG, problem0["prompt"], "has_close_elements")
    assert not program.defined_aux and program.defined_main


# -- the level arithmetic, by hand -----------------------------------------------------------------------------

NONE = dict(
    defined_aux=False,
    defined_main=False,
    parses=False,
    tests_passed=0,
    tests_total=4,
    uses_aux=False,
    wrapper=False,
    dropped_result=False,
)


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        ({}, 0.0),
        (dict(defined_aux=True), 0.4),  # aux alone, then stop: no main
        (dict(defined_aux=True, parses=True, tests_passed=4, uses_aux=True), 0.4),  # still no main
        (dict(defined_main=True), 0.6),
        (dict(defined_aux=True, defined_main=True), 1.0),  # does not parse: stop
        (dict(defined_aux=True, defined_main=True, parses=True), 1.5),  # 0/4 tests
        (dict(defined_aux=True, defined_main=True, parses=True, tests_passed=3), 1.5 + 0.75),
        (
            dict(defined_aux=True, defined_main=True, parses=True, tests_passed=4, uses_aux=True),
            0.4 + 0.6 + 0.5 + 1 + 0.5 + 1,
        ),
        (dict(defined_aux=True, defined_main=True, parses=True, tests_passed=4, uses_aux=True, wrapper=True), 3.0),
        (
            dict(defined_aux=True, defined_main=True, parses=True, tests_passed=2, uses_aux=True, dropped_result=True),
            1.5 + 0.5 + 0.5 + 1.0 - 0.5,
        ),  # fmt: skip
        (dict(defined_aux=True, defined_main=True, parses=True, uses_aux=True), 1.5),  # no test passed: no bonus
        (dict(defined_main=True, parses=True, tests_passed=4, uses_aux=True), 0.6 + 0.5 + 1.0),  # no aux: no bonus
    ],
)
def test_level_reward_known_answers(facts, expected):
    assert he.level_reward(**{**NONE, **facts}) == pytest.approx(expected)


def test_the_maximum_is_the_sum_of_the_positive_levels():
    assert sum(v for v in he.LEVEL_VALUES.values() if v > 0) == he.MAX_REWARD == 4.0


# -- known answers on the real sandbox -------------------------------------------------------------------------


def test_canonical_outranks_wrong_which_outranks_unparsable(problem0):
    canonical = problem0["prompt"] + problem0["canonical_solution"]
    mains = [canonical, MAIN_WRONG, MAIN_BROKEN]
    details = TASK.reward_details([AUX_IDLE] * 3, mains, batch_items=[problem0])
    assert [d.reward for d in details] == pytest.approx([2.5, 1.5 + 3 / 7, 1.0])
    assert [d.summary for d in details] == ["parses · 7/7 tests", "parses · 3/7 tests", "does not parse"]
    assert TASK.reward_func([AUX_IDLE] * 3, mains, batch_items=[problem0]) == [d.reward for d in details]


def test_cooperation_levels_on_humaneval_0(problem0):
    mains = [MAIN_USES, MAIN_WRAPS, MAIN_DROPS]
    details = TASK.reward_details([AUX_GAP] * 3, mains, batch_items=[problem0] * 3)
    assert [d.reward for d in details] == pytest.approx([4.0, 3.0, 3.5])
    assert [d.summary for d in details] == [
        "parses · 7/7 tests · uses aux",
        "parses · 7/7 tests · wraps aux",
        "parses · 7/7 tests · uses aux · drops aux result",
    ]
    row = json.loads(json.dumps(dataclasses.asdict(details[0])))
    assert row == {
        "defined_aux": True,
        "defined_main": True,
        "parses": True,
        "tests_passed": 7,
        "tests_total": 7,
        "uses_aux": True,
        "wrapper": False,
        "dropped_result": False,
        "timed_out": False,
        "reward": 4.0,
        "summary": "parses · 7/7 tests · uses aux",
        "error": "",
        "program": details[0].program,
    }
    assert "def aux(" in row["program"] and "gap = aux(numbers)" in row["program"]


def test_a_batch_scores_as_one_by_one_and_needs_its_items(problem0):
    items = TASK.eval_items()[:3]
    mains = [it["prompt"] + it["canonical_solution"] for it in items]
    batched = TASK.reward_func([AUX_IDLE] * 3, mains, batch_items=items)
    assert batched == [TASK.reward_func([AUX_IDLE], [m], batch_items=[it])[0] for m, it in zip(mains, items)]
    assert batched == [2.5, 2.5, 2.5]
    with pytest.raises(ValueError, match="needs batch_items"):
        TASK.reward_func([AUX_IDLE], [MAIN_WRONG])
    with pytest.raises(ValueError, match="missing \\['test'\\]"):
        TASK.reward_func([AUX_IDLE], [MAIN_WRONG], batch_items=[{"prompt": "", "entry_point": "f"}])


def test_an_mbpp_style_jsonl_is_the_same_task_as_a_user_task(tmp_path):
    rows = [
        {
            "task_id": "mbpp/1",
            "prompt": "Write a function square(x) that returns x squared.\nassert square(3) == 9",
            "entry_point": "square",
            "canonical_solution": "def square(x):\n    return x * x\n",
            "test": "assert square(3) == 9\nassert square(-2) == 4\nassert square(0) == 0\n",
        }
    ]
    path = tmp_path / "mbpp.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    task = load_user_task("comlrl_lab.data.tasks.humaneval", data=path)
    assert (task.name, task.num_agents, task.reward_range) == ("humaneval", 2, (0.0, 4.0))
    item = task.train_items()[0]
    assert "`square`" in task.prompts(item)[1]
    mains = [item["canonical_solution"], "def square(x):\n    return x + x\n"]
    details = task.reward_details([AUX_IDLE] * 2, mains, batch_items=[item])
    assert [(d.tests_passed, d.tests_total, d.reward) for d in details] == [(3, 3, 2.5), (1, 3, 1.5 + 1 / 3)]


# -- hostile programs through the reward -----------------------------------------------------------------------

ADD_ITEM = {
    "task_id": "test/add",
    "prompt": 'def add(a, b):\n    """Return a + b."""\n',
    "entry_point": "add",
    "canonical_solution": "    return a + b\n",
    "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(0, 0) == 0\n",
}
AUX_ADD = "def aux(a, b):\n    return a + b\n"
#: What every hostile program earns: aux and main defined, the program parses, no test passes. (Each hostile entry
#: point has a return of a value, often unreachable, so that it counts as defined.)
FAILED_TESTS = 0.4 + 0.6 + 0.5
SECRET = "s3cr3t-comlrl-test-value"


def _isolations() -> list[str]:
    best = sandbox_capabilities().isolation
    return [best] if best == "rlimits" else [best, "rlimits"]


@pytest.fixture(params=_isolations())
def isolation(request, monkeypatch):
    """The reward's sandbox limits for one isolation mode, short enough for tests; no sandbox process may outlive
    a case."""
    limits = SandboxLimits(
        isolation="rlimits" if request.param == "rlimits" else "auto",
        wall_time_s=3,
        per_test_time_s=1,
        cpu_time_s=3,
        memory_bytes=256 << 20,
    )
    monkeypatch.setattr(he, "SANDBOX_LIMITS", limits)
    caps = sandbox_capabilities(limits)
    yield caps
    assert _sandbox_processes_after_a_moment() == []


def _sandbox_processes_after_a_moment() -> list[int]:
    """Live processes running the launcher (the launcher, its child or anything they forked)."""
    deadline = time.monotonic() + 3
    while True:
        found = []
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                continue
            if b"comlrl_lab/sandbox/_launcher.py" in cmdline:
                found.append(int(name))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _score(main: str):
    (levels,) = TASK.reward_details([AUX_ADD], [main], batch_items=[ADD_ITEM])
    assert levels.reward == TASK.reward_func([AUX_ADD], [main], batch_items=[ADD_ITEM])[0]
    return levels


def test_the_baseline_passes_in_every_mode(isolation):
    levels = _score("def add(a, b):\n    return a + b\n")
    assert (levels.tests_passed, levels.reward) == (2, FAILED_TESTS + 1.0)


def test_killing_the_parent_init_or_everyone_reaches_no_one_outside(isolation):
    if isolation.isolation == "rlimits" and os.geteuid() != 0:
        # Without namespaces or a uid to drop to, kill(-1) would take this test process down too: the mode says so.
        assert any("signal" in note for note in isolation.not_enforced)
        pytest.skip("rlimits mode as a non-root user reports that programs may signal the trainer's processes")
    main = (
        "import os, signal\n"
        "def add(a, b):\n"
        "    for pid in (os.getppid(), 1, 0, -1):\n"
        "        try:\n"
        "            os.kill(pid, signal.SIGKILL)\n"
        "        except OSError:\n"
        "            pass\n"
        "    return None\n"
    )
    levels = _score(main)  # this process is alive to read the answer
    assert levels.reward == FAILED_TESTS and levels.tests_passed == 0


def test_writes_outside_the_working_folder_do_not_land(isolation, tmp_path):
    stem = f"comlrl-escape-{os.getpid()}"
    targets = [Path("/tmp") / stem, tmp_path / stem, ROOT / stem]
    lines = "".join(f"        ({str(t)!r}),\n" for t in targets)
    main = (
        "def add(a, b):\n"
        f"    for path in (\n{lines}    ):\n"
        "        try:\n"
        "            with open(path, 'w') as f:\n"
        "                f.write('escaped')\n"
        "        except OSError:\n"
        "            pass\n"
        "    return None\n"
    )
    try:
        assert _score(main).reward == FAILED_TESTS
        landed = [t for t in targets if t.exists()]
    finally:
        for t in targets:
            t.unlink(missing_ok=True)
    if "read-only filesystem" in isolation.enforced:
        assert landed == []
    else:
        assert "read-only filesystem" in isolation.not_enforced
        if os.geteuid() == 0:  # the uid drop still keeps it out of root's folders
            assert landed in ([], [targets[0]])


@pytest.fixture
def listener():
    """A server on 127.0.0.1 that records every connection it gets."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.1)
    arrived, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            arrived.append(conn.recv(100))
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], arrived
    stop.set()
    thread.join()
    server.close()


def test_no_connection_reaches_a_server_on_loopback(isolation, listener):
    port, arrived = listener
    main = (
        "import socket\n"
        "def add(a, b):\n"
        "    try:\n"
        f"        socket.create_connection(('127.0.0.1', {port}), timeout=1).sendall(b'hello')\n"
        "    except OSError:\n"
        "        return None\n"
        "    return a + b\n"
    )
    levels = _score(main)
    time.sleep(0.2)
    if "no network" in isolation.enforced:
        assert arrived == [] and levels.reward == FAILED_TESTS
    else:
        assert "network (no namespace)" in isolation.not_enforced


def test_secrets_in_the_environment_are_not_visible(isolation, monkeypatch):
    monkeypatch.setenv("COMLRL_FAKE_SECRET", SECRET)
    # A process of the trainer's user holding the secret from its start, where /proc/<pid>/environ shows it.
    holder = subprocess.Popen(["sleep", "30"], env={"PATH": "/usr/bin:/bin", "COMLRL_FAKE_SECRET": SECRET})
    main = (
        "import os\n"
        "def leaked():\n"
        f"    if {SECRET!r} in str(os.environ):\n"
        "        return True\n"
        "    for pid in os.listdir('/proc'):\n"
        "        try:\n"
        "            with open(f'/proc/{pid}/environ', 'rb') as f:\n"
        f"                if {SECRET.encode()!r} in f.read():\n"
        "                    return True\n"
        "        except OSError:\n"
        "            pass\n"
        "    return False\n"
        "def add(a, b):\n"
        "    return a + b if leaked() else None\n"
    )
    try:
        levels = _score(main)
    finally:
        holder.kill()
        holder.wait()
    if isolation.isolation == "rlimits" and os.geteuid() != 0:
        assert any("read that user's processes" in note for note in isolation.not_enforced)
    else:
        assert levels.tests_passed == 0 and levels.reward == FAILED_TESTS


def test_a_segfault_fails_its_tests_and_is_named(isolation):
    levels = _score("import ctypes\ndef add(a, b):\n    return ctypes.string_at(0)\n")
    assert (levels.reward, levels.error) == (FAILED_TESTS, f"killed by signal {signal.SIGSEGV.value}")


def test_a_flood_of_output_fails_its_tests_quickly(isolation):
    levels = _score("def add(a, b):\n    while True:\n        print('A' * 65536)\n    return a + b\n")
    assert levels.reward == FAILED_TESTS and not levels.timed_out


def test_exiting_early_is_not_passing(isolation):
    # "return a + b" is never reached; it makes the entry point count as defined.
    for main in (
        "import os\ndef add(a, b):\n    os._exit(0)\n    return a + b\n",
        "import sys\ndef add(a, b):\n    sys.exit(0)\n    return a + b\n",
    ):
        assert _score(main).tests_passed == 0


def test_a_process_that_leaves_its_group_is_still_killed(isolation):
    main = (
        "import os, time\n"
        "def add(a, b):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        time.sleep(60)\n"
        "    return None\n"
    )
    assert _score(main).reward == FAILED_TESTS  # and the fixture finds no process left


@pytest.mark.slow
def test_unbounded_allocation_fails_its_tests(isolation):
    levels = _score(
        "def add(a, b):\n    hoard = []\n    while True:\n        hoard.append(bytearray(10**7))\n    return a + b\n"
    )
    assert levels.reward == FAILED_TESTS


@pytest.mark.slow
def test_a_fork_loop_is_stopped_and_its_tree_killed(isolation):
    main = "import os\ndef add(a, b):\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass\n    return a + b\n"
    levels = _score(main)
    # Each test runs out of its budget (the forked copies loop on until the run ends and takes them along).
    assert (levels.reward, levels.timed_out, levels.summary) == (FAILED_TESTS, True, "parses · 0/2 tests · timed out")


@pytest.mark.slow
def test_a_loop_ignoring_every_signal_is_killed_on_the_wall_clock(isolation):
    main = (
        "import signal\n"
        "def add(a, b):\n"
        "    for s in range(1, 65):\n"
        "        try:\n"
        "            signal.signal(s, signal.SIG_IGN)\n"
        "        except (OSError, ValueError):\n"
        "            pass\n"
        "    while True:\n"
        "        pass\n"
        "    return a + b\n"
    )
    started = time.monotonic()
    levels = _score(main)
    assert (levels.reward, levels.timed_out, levels.error) == (FAILED_TESTS, True, "timed out")
    assert time.monotonic() - started < 3 + 5  # one 3 s wall clock (_score's second call is a cache hit), start-up
