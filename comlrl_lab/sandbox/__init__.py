"""Runs model-written programs in locked-down processes of their own, never in the caller's process.

Model-written code is hostile input. ``run_program`` / ``run_programs`` hand each program to a launcher process
that runs it in a child with its own pid, network, IPC and mount namespaces (where the host allows them), an empty
tmpfs working folder and HOME, an empty environment, rlimits on CPU, memory, file size, processes and open files,
an unprivileged uid when the caller is root, capped output and a wall clock that kills its whole process tree.
Where no namespace can be made it still runs with rlimits and a killed process tree, and every result says what
was not enforced (``SandboxCapabilities`` for a once-per-run log line). ``split_check`` turns HumanEval-style
test code into counted, individually guarded tests. ``docs/sandbox.md`` lists what is enforced where.

This package never imports torch or streamlit, and it does not score anything: tasks turn results into rewards.
"""

from comlrl_lab.sandbox.checks import CheckSuite, split_check
from comlrl_lab.sandbox.limits import SandboxLimits
from comlrl_lab.sandbox.runner import (
    ResultCache,
    SandboxCapabilities,
    SandboxError,
    SandboxJob,
    SandboxResult,
    run_program,
    run_programs,
    sandbox_capabilities,
)

__all__ = [
    "CheckSuite",
    "ResultCache",
    "SandboxCapabilities",
    "SandboxError",
    "SandboxJob",
    "SandboxLimits",
    "SandboxResult",
    "run_program",
    "run_programs",
    "sandbox_capabilities",
    "split_check",
]
