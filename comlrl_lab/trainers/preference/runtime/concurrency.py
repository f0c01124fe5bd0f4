"""One function per agent over the agents' devices: in order, or in threads where the devices (or CPU cores) let
agents overlap.

Agents on distinct CUDA devices run in one thread each: generate waits on its device at every step, so one thread
per device keeps all of them busy. CPU agents do so too with ``concurrent_cpu_agents``, torch's threads split
between them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch

from comlrl_lab.trainers.preference.runtime.devices import concurrent_devices

T = TypeVar("T")


def available_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@contextlib.contextmanager
def _torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``count`` meanwhile (process-wide), then put back."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def map_agents(fn: Callable[[int], T], devices: Sequence[Any], *, concurrent_cpu: bool = False) -> list[T]:
    """``[fn(0), ..., fn(A-1)]``, one agent per device; concurrent (one thread per agent) when the agents sit on
    two or more distinct CUDA devices, in order otherwise.

    ``concurrent_cpu`` (the ``concurrent_cpu_agents`` field) also runs agents that all sit on the CPU in one
    thread each, when the process has at least two cores, with torch's intra-op threads split between them
    (torch's count is process-wide: it reads threads / agents, at least 1, until they have all finished).
    """
    count = len(devices)
    if count < 2:
        return [fn(i) for i in range(count)]
    if concurrent_devices(list(devices)):
        return _in_threads(fn, count)
    on_cpu = all(torch.device(d).type == "cpu" for d in devices)
    # Differs from CoMLRL: its agents always run one after the other; here CPU agents may overlap (opt-in).
    if concurrent_cpu and on_cpu and available_cores() >= 2:
        per_agent = max(1, torch.get_num_threads() // count)
        with _torch_threads(per_agent):
            return _in_threads(fn, count)
    return [fn(i) for i in range(count)]


def _in_threads(fn: Callable[[int], T], count: int) -> list[T]:
    with ThreadPoolExecutor(max_workers=count, thread_name_prefix="comlrl-lab-agent") as pool:
        futures = [pool.submit(fn, i) for i in range(count)]
        return [f.result() for f in futures]
