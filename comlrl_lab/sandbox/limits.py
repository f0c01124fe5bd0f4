"""``SandboxLimits``: what one sandboxed program may use, each field with the help text the docs and UI show.

The limits are plain data, checked once in ``__post_init__``; the launcher turns them into rlimits, a tmpfs size
and a wall clock. This module starts no process.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

ISOLATIONS = ("auto", "namespaces", "rlimits")
MIB = 1 << 20


@dataclass(frozen=True)
class SandboxLimits:
    """Limits for one program run; the defaults suit HumanEval-sized functions and their tests."""

    wall_time_s: float = field(
        default=10.0,
        metadata={"help": "Wall-clock seconds for the whole run (program and every test); then its whole process "
                  "tree is killed."},
    )  # fmt: skip
    per_test_time_s: float = field(
        default=3.0,
        metadata={"help": "Seconds each test may take inside the wall clock (a SIGALRM in the program's process); "
                  "a test past it counts as failed and the next one starts."},
    )  # fmt: skip
    cpu_time_s: float = field(
        default=10.0,
        metadata={"help": "CPU seconds (RLIMIT_CPU, rounded up; SIGKILL one second later)."},
    )
    memory_bytes: int = field(
        default=512 * MIB,
        metadata={"help": "Address space in bytes (RLIMIT_AS): a bigger allocation raises MemoryError."},
    )
    disk_bytes: int = field(
        default=16 * MIB,
        metadata={"help": "Largest file the program may write (RLIMIT_FSIZE), and with namespaces the size of its "
                  "whole tmpfs working folder."},
    )  # fmt: skip
    max_processes: int = field(
        default=20,
        metadata={"help": "Processes and threads the program may add (RLIMIT_NPROC, over those its uid already "
                  "runs): a fork loop stops there."},
    )  # fmt: skip
    max_open_files: int = field(
        default=64,
        metadata={"help": "Open file descriptors (RLIMIT_NOFILE)."},
    )
    max_output_bytes: int = field(
        default=64 * 1024,
        metadata={"help": "Bytes kept of stdout and of stderr each; past it the pipe is closed, so a flood ends."},
    )
    uid: int = field(
        default=65534,
        metadata={"help": "Unprivileged uid a root trainer drops to before the program runs (65534 is 'nobody')."},
    )
    gid: int = field(
        default=65534,
        metadata={"help": "Unprivileged gid a root trainer drops to before the program runs."},
    )
    isolation: str = field(
        default="auto",
        metadata={"help": "'auto': namespaces where the host allows them, else rlimits alone (reported); "
                  "'namespaces': refuse to run without them; 'rlimits': never make namespaces.",
                  "choices": ISOLATIONS},
    )  # fmt: skip
    python: str | None = field(
        default=None,
        metadata={"help": "Interpreter that runs the launcher and the programs; None picks the first of "
                  "/usr/bin/python3 and this Python that works after the uid drop."},
    )  # fmt: skip

    def __post_init__(self) -> None:
        for name in ("wall_time_s", "per_test_time_s", "cpu_time_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise ValueError(f"{name} must be a number of seconds in (0, 3600], got {value!r}")
        minimum = {"memory_bytes": 64 * MIB, "disk_bytes": 4096, "max_processes": 1, "max_open_files": 16}
        for name, low in {**minimum, "max_output_bytes": 0, "uid": 1, "gid": 1}.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"isolation must be one of: {', '.join(ISOLATIONS)}; got {self.isolation!r}")
        if self.python is not None and (not isinstance(self.python, str) or not self.python):
            raise ValueError(f"python must be a path to an interpreter or None, got {self.python!r}")

    def launcher_limits(self) -> dict[str, Any]:
        """The numbers the launcher enforces, as its request carries them."""
        keep = {"uid", "gid", "isolation", "python"}
        return {k: v for k, v in asdict(self).items() if k not in keep}
