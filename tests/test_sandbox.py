"""The sandbox on its own: test splitting worked out by hand, what a run reports, limits, the cache and the pool.

Hostile programs driven through the humaneval reward are in test_humaneval_task.py; the programs here are plain
ones that check the mechanics (stdout, stdin, exit status, per-test counting and time budgets, output cap), all in
the real sandbox. Nothing here runs a program in the test process.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import fields
from pathlib import Path

import pytest

from comlrl_lab.sandbox import (
    ResultCache,
    SandboxError,
    SandboxJob,
    SandboxLimits,
    run_program,
    run_programs,
    runner,
    sandbox_capabilities,
    split_check,
)

FAST = SandboxLimits(wall_time_s=5, per_test_time_s=1, cpu_time_s=5)

# -- split_check: parsing only ---------------------------------------------------------------------------------


def test_each_assert_of_check_is_one_test_and_constant_asserts_are_not_counted():
    suite = split_check(
        "METADATA = {}\n\n\ndef check(candidate):\n"
        "    assert candidate(1) == 2\n"
        "    assert candidate(2) == 3, 'message'\n"
        "    assert True, 'This prints if this assert fails'\n"
        "    assert abs(candidate(0.5) - 1.5) < 1e-6\n",
        "inc",
    )
    assert (suite.total, suite.entry_point) == (3, "inc")
    assert "def __sandbox_check__(candidate, __sandbox_step__):" in suite.source
    assert suite.source.count("__sandbox_step__.begin()") == 4  # the constant assert still runs, uncounted


def test_a_loop_of_asserts_is_one_test_and_set_up_lines_are_not_tests():
    suite = split_check(
        "def check(candidate):\n    import math\n    xs = [1, 2]\n    for x in xs:\n        assert candidate(x) == x\n"
        "    assert candidate(3) == 3\n",
        "f",
    )
    assert suite.total == 2
    assert ".end(-1," in suite.source and ".end(0," in suite.source and ".end(1," in suite.source


def test_top_level_asserts_without_check_are_tests_too():
    suite = split_check("assert f(2) == 4\nassert f(3) == 9\nx = 1\n", "f")
    assert suite.total == 2


@pytest.mark.parametrize(
    ("test", "message"),
    [("def check(candidate):\n    pass\n", "holds no assert"), ("def check(:\n", "does not parse")],
)
def test_unusable_test_code_is_refused(test, message):
    with pytest.raises(ValueError, match=message):
        split_check(test, "f")


# -- limits ----------------------------------------------------------------------------------------------------


def test_every_limit_has_help_text():
    assert all(f.metadata.get("help") for f in fields(SandboxLimits))


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("wall_time_s", 0, "wall_time_s must be a number of seconds"),
        ("memory_bytes", 1000, "memory_bytes must be an integer >= 67108864"),
        ("max_processes", True, "max_processes must be an integer >= 1"),
        ("uid", 0, "uid must be an integer >= 1"),
        ("isolation", "none", "isolation must be one of: auto, namespaces, rlimits"),
    ],
)
def test_bad_limits_name_the_field_and_the_value(name, value, message):
    with pytest.raises(ValueError, match=message):
        SandboxLimits(**{name: value})


# -- one run ---------------------------------------------------------------------------------------------------


def test_a_program_runs_as_a_script_with_its_stdin_and_a_bare_environment():
    result = run_program("import os, sys\nprint(sys.stdin.read().upper())\nprint(sorted(os.environ))", stdin="hi")
    assert result.exit_status == 0 and result.killed_by_signal is None and not result.timed_out
    assert result.stdout.splitlines() == ["HI", "['HOME', 'LANG', 'PATH', 'TMPDIR']"]
    assert result.load_error is None and result.tests_total == 0


def test_exit_status_and_load_error_are_the_programs():
    assert run_program("raise SystemExit(3)").exit_status == 3
    failed = run_program("undefined_name")
    assert (failed.exit_status, failed.load_error) == (1, "NameError")
    assert "NameError: name 'undefined_name' is not defined" in failed.stderr
    assert "_launcher" not in failed.stderr  # the traceback starts at the program


def test_tests_are_counted_one_by_one_and_a_failure_or_exit_does_not_stop_the_rest():
    tests = split_check(
        "def check(candidate):\n"
        "    assert candidate(1) == 1\n"
        "    assert candidate(2) == 5\n"  # wrong answer
        "    assert candidate(-1) == 1\n"  # raises SystemExit: a failure, not the end of the run
        "    assert candidate(3) == 3\n",
        "ident",
    )
    source = "import sys\ndef ident(x):\n    if x < 0:\n        sys.exit(0)\n    return x\n"
    result = run_program(source, tests, limits=FAST)
    assert result.test_outcomes == ("pass", "fail", "fail", "pass")
    assert (result.tests_passed, result.tests_total) == (2, 4)


def test_a_test_past_its_budget_times_out_and_the_next_one_runs():
    tests = split_check("def check(candidate):\n    assert candidate(1)\n    assert candidate(0) == 0\n", "f")
    result = run_program("def f(x):\n    while x:\n        pass\n    return x\n", tests, limits=FAST)
    assert result.test_outcomes == ("timeout", "pass")
    assert result.any_timeout and not result.timed_out and result.wall_time_s < FAST.wall_time_s


def test_a_program_that_does_not_load_passes_no_test():
    tests = split_check("def check(candidate):\n    assert candidate() == 1\n", "f")
    result = run_program("def f():\n    return 1\nraise ValueError('at load')\n", tests, limits=FAST)
    assert result.load_error == "ValueError" and result.test_outcomes == ("not run",)


def test_output_past_the_cap_is_cut_and_the_flood_stops():
    limits = SandboxLimits(max_output_bytes=1000, wall_time_s=5)
    result = run_program("import sys\nwhile True:\n    sys.stdout.write('A' * 4096)\n", limits=limits)
    assert result.stdout == "A" * 1000 and result.stdout_truncated and not result.timed_out
    assert result.exit_status == 1 and "BrokenPipeError" in result.stderr


def test_a_program_cannot_pass_itself_off_as_a_broken_sandbox():
    # It writes a forged "set-up failed" record (and a long load record) to every descriptor it might hold.
    source = (
        "import os\n"
        "for fd in range(3, 64):\n"
        "    try:\n"
        "        os.write(fd, b'S \"forged\"\\nN {}\\nL ' + b'x' * 5000 + b'\\n')\n"
        "    except OSError:\n"
        "        pass\n"
        "raise SystemExit(0)\n"
    )
    result = run_program(source, limits=FAST)  # no SandboxError
    assert result.exit_status == 0 and len(result.load_error) <= 80


def test_capabilities_say_what_is_enforced():
    caps = sandbox_capabilities()
    assert caps.isolation in ("root-namespaces", "user-namespaces", "rlimits")
    assert {"CPU time limit", "address space limit", "processes limit", "empty environment"} <= set(caps.enforced)
    assert caps.summary().startswith(f"sandbox: {caps.isolation} with {caps.python}")
    degraded = sandbox_capabilities(SandboxLimits(isolation="rlimits"))
    assert degraded.isolation == "rlimits"
    assert {"network (no namespace)", "read-only filesystem"} <= set(degraded.not_enforced)


def test_a_missing_interpreter_is_a_sandbox_error():
    with pytest.raises(SandboxError, match="no interpreter can run sandboxed programs here: /no/python: not found"):
        sandbox_capabilities(SandboxLimits(python="/no/python"))


# -- many runs: the pool and the cache -------------------------------------------------------------------------


@pytest.fixture
def counted_launches(monkeypatch):
    """Replace the launcher call by a recorder: how many ran, and how many at once."""
    calls, running, peak = [], [0], [0]
    lock = threading.Lock()
    real = runner._launch

    def launch(python, job, limits):
        with lock:
            calls.append(job.source)
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        try:
            return real(python, job, limits)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(runner, "_launch", launch)
    return calls, peak


def test_identical_programs_run_once_and_the_cache_answers_repeats(counted_launches):
    calls, _ = counted_launches
    cache = ResultCache()
    jobs = [SandboxJob("print(1)"), SandboxJob("print(2)"), SandboxJob("print(1)"), SandboxJob("print(1)", stdin="x")]
    results = run_programs(jobs, cache=cache)
    assert [r.stdout for r in results] == ["1\n", "2\n", "1\n", "1\n"]
    assert sorted(calls) == ["print(1)", "print(1)", "print(2)"]  # the stdin makes the fourth job distinct
    assert run_programs(jobs[:2], cache=cache)[1].stdout == "2\n" and len(calls) == 3
    run_programs(jobs[:2], cache=None)
    assert len(calls) == 5 and len(cache) == 3


def test_the_cache_drops_the_least_recently_used():
    cache = ResultCache(max_entries=2)
    first, second = run_programs([SandboxJob("print(1)"), SandboxJob("print(2)")], cache=None)
    cache.put("a", first)
    cache.put("b", second)
    assert cache.get("a") is first  # now "b" is the oldest
    cache.put("c", second)
    assert cache.get("b") is None and cache.get("a") is first and len(cache) == 2


def test_distinct_programs_run_in_parallel_up_to_max_workers(counted_launches):
    _, peak = counted_launches
    run_programs([SandboxJob(f"print({i})") for i in range(6)], max_workers=2, cache=None)
    assert peak[0] == 2


# -- the sandbox of a trainer that is not root -----------------------------------------------------------------

# Run by an unprivileged uid: a process of that uid holds a secret and must survive; the programs try to kill it,
# read its environment, write into a folder of that uid and reach the network.
AS_USER_SCRIPT = r"""
import json, os, subprocess, sys
sys.path.insert(0, sys.argv[1])
from comlrl_lab.sandbox import run_program, sandbox_capabilities
folder, secret = sys.argv[2], sys.argv[3]
holder = subprocess.Popen(["sleep", "30"], env={"PATH": "/usr/bin:/bin", "COMLRL_FAKE_SECRET": secret})
programs = {
    "kill": "import os, signal\nfor pid in range(2, 1 << 16):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
            "    except OSError:\n        pass\nos.kill(-1, signal.SIGKILL)\n",
    "environ": "import os\nfor pid in os.listdir('/proc'):\n    try:\n        print(open(f'/proc/{pid}/environ').read())\n"
               "    except OSError:\n        pass\n",
    "write": f"open({folder!r} + '/escaped', 'w').write('x')\n",
    "net": "import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=1)\n",
}
out = {"isolation": sandbox_capabilities().isolation}
for name, source in programs.items():
    result = run_program(source)
    out[name] = {"status": result.exit_status, "stdout": result.stdout, "stderr": result.stderr[-300:]}
out["holder_alive"] = holder.poll() is None
out["escaped"] = os.path.exists(folder + "/escaped")
holder.kill()
print(json.dumps(out))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to become a user")
def test_a_trainer_that_is_not_root_gets_user_namespaces():
    repo = Path(__file__).resolve().parents[1]
    readable = all(os.stat(p).st_mode & 0o005 == 0o005 for p in [repo, *repo.parents])
    if not readable or not os.path.exists("/usr/bin/python3"):
        pytest.skip("the checkout or /usr/bin/python3 is not readable by another user")
    if not os.path.isdir("/var/tmp"):
        pytest.skip("no /var/tmp for a folder of the user outside the sandbox's own /tmp")
    uid = 54321
    folder = Path(tempfile.mkdtemp(prefix="comlrl-user-", dir="/var/tmp"))  # pytest's tmp_path is root's alone
    try:
        os.chown(folder, uid, uid)
        command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/usr/bin/python3", "-I", "-c"]
        done = subprocess.run(
            [*command, AS_USER_SCRIPT, str(repo), str(folder), "s3cr3t-of-the-trainer"],
            capture_output=True,
            text=True,
            timeout=120,
            env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"},
        )
        escaped = (folder / "escaped").exists()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    if out["isolation"] != "user-namespaces":
        pytest.skip(f"this host gives an unprivileged user {out['isolation']}")
    assert out["holder_alive"] and not out["escaped"] and not escaped
    assert "s3cr3t" not in out["environ"]["stdout"]
    assert out["write"]["status"] == 1 and "Read-only file system" in out["write"]["stderr"]
    assert out["net"]["status"] == 1 and "Network is unreachable" in out["net"]["stderr"]
