"""Runs untrusted programs through the launcher, one process tree each, in parallel, with identical ones run once.

The calling process (a trainer, a page, a test) only starts ``_launcher.py`` under a system Python with an empty
environment, writes one JSON request and reads one bounded JSON answer; the program itself runs in the
launcher's child (see ``_launcher.py`` for what is enforced there). ``run_programs`` keeps up to one launcher per
core busy from a thread pool and answers repeated (program, tests, stdin, limits) from a bounded cache.

It never executes the program text here, and a program's failure, crash or hang is a ``SandboxResult``; only a
sandbox that cannot start (no working interpreter, a refused isolation) raises ``SandboxError``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from comlrl_lab.sandbox.checks import CheckSuite
from comlrl_lab.sandbox.limits import SandboxLimits

LAUNCHER = Path(__file__).with_name("_launcher.py")
SYSTEM_PYTHONS = ("/usr/bin/python3",)
MAX_SOURCE_BYTES = 1 << 20  # program + tests + stdin: a bigger request is refused before any process starts
# Folders mounted over with an empty tmpfs in the namespaced sandbox; the trainer's HOME is added at run time.
HIDDEN_FOLDERS = ("/home", "/root", "/run", "/mnt", "/media", "/srv", "/dev/shm")
# The launcher's start-up, sweep and answer on top of the program's wall clock.
LAUNCHER_GRACE_S = 15.0


class SandboxError(RuntimeError):
    """The sandbox itself could not run a program (not the program failing: that is a ``SandboxResult``)."""


@dataclass(frozen=True)
class SandboxJob:
    """One program to run: its source, optional tests (``split_check``) and the text its stdin reads."""

    source: str
    tests: CheckSuite | None = None
    stdin: str = ""


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run did. ``test_outcomes`` has one entry per test: pass, fail, timeout or not run."""

    exit_status: int | None  # the program's exit status; None when a signal ended it
    killed_by_signal: int | None
    timed_out: bool  # the wall clock ran out and the whole process tree was killed
    tests_passed: int
    tests_total: int
    test_outcomes: tuple[str, ...]
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    wall_time_s: float
    load_error: str | None  # the exception that stopped the program before its tests ("NameError", "SystemExit")
    isolation: str  # root-namespaces, user-namespaces or rlimits
    enforced: tuple[str, ...] = field(default=(), repr=False)
    not_enforced: tuple[str, ...] = field(default=(), repr=False)

    @property
    def any_timeout(self) -> bool:
        """The wall clock ran out or at least one test ran past its own budget."""
        return self.timed_out or "timeout" in self.test_outcomes


@dataclass(frozen=True)
class SandboxCapabilities:
    """What this host's sandbox enforces, from one probe run: log it once per training run."""

    python: str
    isolation: str
    enforced: tuple[str, ...]
    not_enforced: tuple[str, ...]

    def summary(self) -> str:
        missing = "; not enforced: " + ", ".join(self.not_enforced) if self.not_enforced else ""
        return f"sandbox: {self.isolation} with {self.python}{missing}"


# --------------------------------------------------------------------------------------------------
# One run


def _request(job: SandboxJob, limits: SandboxLimits) -> bytes:
    tests = job.tests
    hide = list(HIDDEN_FOLDERS)
    home = os.path.expanduser("~")
    if home not in ("/", "") and home not in hide:
        hide.append(home)
    payload = {
        "program": job.source,
        "check": tests.source if tests else None,
        "entry_point": tests.entry_point if tests else None,
        "tests_total": tests.total if tests else 0,
        "stdin": job.stdin,
        "limits": limits.launcher_limits(),
        "isolation": limits.isolation,
        "uid": limits.uid,
        "gid": limits.gid,
        "hide": hide,
    }
    data = json.dumps(payload).encode("utf-8")
    if len(data) > MAX_SOURCE_BYTES:
        raise SandboxError(
            f"program, tests and stdin take {len(data)} bytes; the sandbox takes at most {MAX_SOURCE_BYTES}"
        )
    return data


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM lets the launcher kill its child first; SIGKILL to its group if it does not go."""
    try:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=2)
    except (subprocess.TimeoutExpired, OSError):
        pass
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _launch(python: str, job: SandboxJob, limits: SandboxLimits) -> SandboxResult:
    request = _request(job, limits)
    process = subprocess.Popen(
        [python, "-I", "-S", "-B", str(LAUNCHER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        cwd="/",
        start_new_session=True,
        close_fds=True,
    )
    try:
        # The launcher is our code and caps what it relays, so its answer is bounded: communicate() is safe here.
        out, err = process.communicate(request, timeout=limits.wall_time_s + LAUNCHER_GRACE_S)
    except subprocess.TimeoutExpired:
        _stop(process)
        waited = limits.wall_time_s + LAUNCHER_GRACE_S
        raise SandboxError(f"the sandbox launcher did not answer within {waited:.0f} s") from None
    except BaseException:
        _stop(process)
        raise
    try:
        answer = json.loads(out.decode("utf-8"))
    except ValueError:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise SandboxError(f"the sandbox launcher ({python}) failed: {' | '.join(tail) or 'no answer'}") from None
    if answer.get("error"):
        raise SandboxError(answer["error"])
    outcomes = tuple(answer["outcomes"])
    load = answer["load"]
    return SandboxResult(
        exit_status=answer["exit_status"],
        killed_by_signal=answer["signal"],
        timed_out=answer["timed_out"],
        tests_passed=outcomes.count("pass"),
        tests_total=len(outcomes),
        test_outcomes=outcomes,
        stdout=answer["stdout"],
        stderr=answer["stderr"],
        stdout_truncated=answer["stdout_truncated"],
        stderr_truncated=answer["stderr_truncated"],
        wall_time_s=answer["wall_time_s"],
        load_error=None if load == "ok" else (load or "no report"),
        isolation=answer["isolation"],
        enforced=tuple(answer["enforced"]),
        not_enforced=tuple(answer["not_enforced"]),
    )


# A lazily loaded module of the standard library that PRELOAD does not cover: importing it after the uid drop
# proves the interpreter's library is readable by the unprivileged uid.
_PROBE = "import textwrap, unicodedata\nprint(textwrap.shorten('sandbox probe ok', 40))\n"
_probe_lock = threading.Lock()
# Successful probes only: a probe that failed (a busy machine, a missing interpreter) is tried again next time.
_probed: dict[tuple[str, str, int, int], SandboxCapabilities] = {}


def _probe(python: str, isolation: str, uid: int, gid: int) -> SandboxCapabilities | str:
    """Capabilities when ``python`` can run the probe under these settings, else why not."""
    limits = SandboxLimits(isolation=isolation, uid=uid, gid=gid, python=python)
    try:
        result = _launch(python, SandboxJob(_PROBE), limits)
    except (SandboxError, OSError) as exc:
        return str(exc)
    if result.stdout.strip() != "sandbox probe ok":
        reason = result.stderr.strip().splitlines()[-1:] or [f"exit status {result.exit_status}"]
        return f"the probe program failed: {reason[0]}"
    return SandboxCapabilities(python, result.isolation, result.enforced, result.not_enforced)


def sandbox_capabilities(limits: SandboxLimits | None = None) -> SandboxCapabilities:
    """The interpreter and isolation these limits get here; probed once per process, ``SandboxError`` if none works.

    Without ``limits.python`` the candidates are the system Python, then this one: a Python under /root (pyenv, a
    venv of root's) cannot import its own library after the uid drop, and the probe finds that out.
    """
    limits = limits or SandboxLimits()
    if os.name != "posix":
        raise SandboxError("the sandbox needs a POSIX system (fork, setrlimit)")
    candidates = [limits.python] if limits.python else [*SYSTEM_PYTHONS, sys.executable]
    reasons = []
    with _probe_lock:
        for python in dict.fromkeys(candidates):
            if not os.path.exists(python):
                reasons.append(f"{python}: not found")
                continue
            key = (python, limits.isolation, limits.uid, limits.gid)
            found = _probed.get(key) or _probe(*key)
            if isinstance(found, SandboxCapabilities):
                _probed[key] = found
                return found
            reasons.append(f"{python}: {found}")
    raise SandboxError("no interpreter can run sandboxed programs here: " + "; ".join(reasons))


def run_program(
    source: str, tests: CheckSuite | None = None, *, stdin: str = "", limits: SandboxLimits | None = None
) -> SandboxResult:
    """Run ``source`` as a script in the sandbox, then ``tests`` against it; never in this process."""
    limits = limits or SandboxLimits()
    python = sandbox_capabilities(limits).python
    return _launch(python, SandboxJob(source, tests, stdin), limits)


# --------------------------------------------------------------------------------------------------
# Many runs


class ResultCache:
    """Results by (program, tests, stdin, limits), least recently used dropped past ``max_entries``; thread-safe."""

    def __init__(self, max_entries: int = 4096):
        self.max_entries = max_entries
        self._entries: OrderedDict[str, SandboxResult] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(job: SandboxJob, limits: SandboxLimits) -> str:
        text = json.dumps(
            [job.source, job.tests and (job.tests.source, job.tests.entry_point), job.stdin, repr(limits)]
        )
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def get(self, key: str) -> SandboxResult | None:
        with self._lock:
            result = self._entries.get(key)
            if result is not None:
                self._entries.move_to_end(key)
            return result

    def put(self, key: str, result: SandboxResult) -> None:
        with self._lock:
            self._entries[key] = result
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


DEFAULT_CACHE = ResultCache()


def run_programs(
    jobs: Sequence[SandboxJob],
    limits: SandboxLimits | None = None,
    *,
    max_workers: int | None = None,
    cache: ResultCache | None = DEFAULT_CACHE,
) -> list[SandboxResult]:
    """One ``SandboxResult`` per job, in order: distinct jobs run in parallel (one per core by default), each
    distinct (program, tests, stdin, limits) once; ``cache=None`` runs every distinct job afresh."""
    limits = limits or SandboxLimits()
    python = sandbox_capabilities(limits).python
    keys = [ResultCache.key(job, limits) for job in jobs]
    results: dict[str, SandboxResult] = {}
    todo: dict[str, SandboxJob] = {}
    for key, job in zip(keys, jobs):
        hit = cache.get(key) if cache is not None else None
        if hit is not None:
            results[key] = hit
        elif key not in results:
            todo.setdefault(key, job)
    if todo:
        workers = max(1, min(len(todo), max_workers or os.cpu_count() or 1))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
            futures = {key: pool.submit(_launch, python, job, limits) for key, job in todo.items()}
            for key, future in futures.items():
                results[key] = future.result()
                if cache is not None:
                    cache.put(key, results[key])
    return [results[key] for key in keys]
