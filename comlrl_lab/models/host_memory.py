"""Keep freed host memory in the process for reuse, instead of letting glibc's malloc hand it back to the OS.

Tensors on the CPU come from malloc. glibc serves a large block (above its mmap threshold) with a fresh ``mmap`` and
unmaps it when freed, and it trims free memory at the top of the heap once more than its trim threshold is free. A
training process allocates and frees the same few-megabyte tensors at every step (a decode step's KV cache
concatenation, a backward's gradients), so each step pays for new pages: a page fault and the kernel zeroing
4 KiB for every page touched. On the tiny model's 32-item MADPOIter run that was about 240,000 page faults in
``train()`` and 0.6 s of system time out of about 10 s.

``keep_freed_host_memory`` fixes the mmap threshold at 32 MiB (the largest value glibc accepts on 64-bit, and the
ceiling of its own adjustment) and the trim threshold at 64 MiB (twice that, glibc's own ratio), so blocks below
32 MiB are reused from the heap. The settings are the process's and stay for its lifetime; they change where memory
comes from, never what a tensor holds. ``release_freed_host_memory`` hands the free pages back (``malloc_trim``)
when a run ends, so a long-lived process (the workbench, a notebook) does not keep a finished run's peak. Nothing is
done where malloc is not glibc's or where the user has chosen or tuned it already (``GLIBC_TUNABLES`` malloc
settings, any ``MALLOC_*`` variable, or another allocator in ``LD_PRELOAD``).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Mapping

# mallopt's parameter numbers (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 64 << 20

_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc", "hoard", "snmalloc")

_lock = threading.Lock()
_outcome: str | None = None


def glibc_tunables() -> str:
    """The same two thresholds as a ``GLIBC_TUNABLES`` value, for a process started from outside (benchmarks)."""
    return f"glibc.malloc.mmap_threshold={MMAP_THRESHOLD_BYTES}:glibc.malloc.trim_threshold={TRIM_THRESHOLD_BYTES}"


def user_tuned_malloc(environ: Mapping[str, str] = os.environ) -> str | None:
    """What in ``environ`` shows that malloc was chosen or tuned by the user (a short reason), or None."""
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES sets malloc options"
    tuned = sorted(name for name in environ if name.startswith("MALLOC_"))
    if tuned:
        return f"{tuned[0]} is set"
    preload = environ.get("LD_PRELOAD", "").lower()
    for allocator in _OTHER_ALLOCATORS:
        if allocator in preload:
            return f"LD_PRELOAD loads {allocator}"
    return None


def is_glibc() -> bool:
    """Whether this process's C library is glibc (False on macOS, Windows and musl)."""
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (AttributeError, OSError, ValueError, TypeError):  # no confstr, or a libc without the name
        return False


def keep_freed_host_memory() -> str:
    """Set glibc's mmap and trim thresholds once per process; returns what was done (for logs and tests).

    ``"set"`` the first time it applies them, ``"already set"`` afterwards, or ``"skipped: <reason>"``.
    """
    global _outcome
    with _lock:
        if _outcome is not None:
            return "already set" if _outcome == "set" else _outcome
        reason = None if is_glibc() else "malloc is not glibc's"
        reason = reason or user_tuned_malloc()
        if reason is None:
            mallopt = ctypes.CDLL(None).mallopt
            mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
            mallopt.restype = ctypes.c_int
            # mallopt returns 1 on success. If the first is refused the second is not tried, so nothing is half set.
            if not mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES):
                reason = "mallopt refused the mmap threshold"
            elif not mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES):
                reason = "mallopt refused the trim threshold (the mmap threshold stays set)"
        _outcome = "set" if reason is None else f"skipped: {reason}"
        return _outcome


def release_freed_host_memory() -> bool:
    """Hand the heap's free pages back to the OS (``malloc_trim(0)``) if this process set the thresholds; returns
    whether it did. For the end of a run: its freed blocks would otherwise stay in the process."""
    with _lock:
        if _outcome != "set":
            return False
    ctypes.CDLL(None).malloc_trim(0)
    return True
