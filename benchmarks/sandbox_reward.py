"""Benchmark: the humaneval reward on 64 candidates' programs in the sandbox, against the same programs run bare.

The 64 programs are HumanEval/0-63's canonical solutions (trusted code, the only kind this file runs outside the
sandbox), each joined with a trivial ``aux`` as the reward joins a joint response. Timed, median of ``--repeats``:

- **sandboxed, parallel**: ``TASK.reward_details`` on the 64 joint responses: parse, join, and each program plus
  its counted tests in its own sandboxed process tree, one launcher per core (the result cache cleared first);
- **sandboxed, serial**: the same 64 sandbox runs with one worker, for the pool's share of the gain;
- **cached**: the reward again on the same 64 responses (every program answered by the result cache);
- **bare, one process**: what CoMLRL's code suite does: each program and the same counted tests exec'd in this
  process, one after another (no isolation, no time limits).

The ratio sandboxed / bare is the price of isolation per reward call. Timings depend on the machine's load, which
is printed before and after. Usage::

    python benchmarks/sandbox_reward.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from comlrl_lab.data.tasks import get_task
from comlrl_lab.data.tasks.code_program import join_program
from comlrl_lab.data.tasks.humaneval import load_problems
from comlrl_lab.sandbox import SandboxJob, run_programs, sandbox_capabilities, split_check
from comlrl_lab.sandbox.runner import DEFAULT_CACHE

AUX = "def aux(x):\n    return x\n"
CANDIDATES = 64


class _Steps:
    """The harness's step recorder without timers (the bare side has no time limits, as CoMLRL's exec has none
    beyond its SIGALRM per test)."""

    def __init__(self):
        self.passed = 0

    def begin(self):
        pass

    def end(self, index, error):
        self.passed += index >= 0 and error is None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown CPU"


def run_bare(programs: list[str], suites) -> int:
    """Trusted canonical programs only: exec each with its tests in this process; returns the tests passed."""
    passed = 0
    for source, suite in zip(programs, suites):
        namespace: dict = {"__name__": "__main__"}
        exec(compile(source, "<canonical>", "exec"), namespace)
        exec(compile(suite.source, "<tests>", "exec"), namespace)
        steps = _Steps()
        namespace["__sandbox_check__"](namespace[suite.entry_point], steps)
        passed += steps.passed
    return passed


def median_seconds(fn, repeats: int) -> tuple[float, object]:
    times, value = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    task = get_task("humaneval")
    items = [dict(item) for item in load_problems()[:CANDIDATES]]
    mains = [item["prompt"] + item["canonical_solution"] for item in items]
    programs = [join_program(AUX, m, it["prompt"], it["entry_point"]).source for m, it in zip(mains, items)]
    suites = [split_check(it["test"], it["entry_point"]) for it in items]
    caps = sandbox_capabilities()
    load_before = os.getloadavg()
    print(f"CPU: {cpu_model()}, {os.cpu_count()} logical CPUs; load before {load_before[0]:.2f}")
    print(caps.summary())

    def sandboxed():
        DEFAULT_CACHE.clear()
        return task.reward_details([AUX] * CANDIDATES, mains, batch_items=items)

    def serial():
        jobs = [SandboxJob(p, s) for p, s in zip(programs, suites)]
        return run_programs(jobs, max_workers=1, cache=None)

    parallel_s, details = median_seconds(sandboxed, args.repeats)
    serial_s, results = median_seconds(serial, args.repeats)
    cached_s, _ = median_seconds(lambda: task.reward_details([AUX] * CANDIDATES, mains, batch_items=items), 3)
    bare_s, bare_passed = median_seconds(lambda: run_bare(programs, suites), args.repeats)

    total = sum(s.total for s in suites)
    sandbox_passed = sum(d.tests_passed for d in details)
    assert sandbox_passed == bare_passed == total == sum(r.tests_passed for r in results), "the sides disagree"
    inside = statistics.median(r.wall_time_s for r in results)
    print(f"{CANDIDATES} programs, {total} counted tests, all passed on both sides")
    print(
        f"  sandboxed, parallel ({os.cpu_count()} workers): {parallel_s:7.3f} s  ({1000 * parallel_s / CANDIDATES:.1f} ms/program)"
    )
    print(f"  sandboxed, serial (1 worker):        {serial_s:7.3f} s  ({1000 * serial_s / CANDIDATES:.1f} ms/program; "
          f"median {1000 * inside:.1f} ms of it inside the sandbox)")  # fmt: skip
    print(f"  cached repeat:                       {cached_s:7.3f} s")
    print(f"  bare, one process (CoMLRL's way):    {bare_s:7.3f} s")
    print(
        f"ratio sandboxed parallel / bare: {parallel_s / bare_s:.1f}x; serial / parallel: {serial_s / parallel_s:.2f}x"
    )
    print(f"load after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
