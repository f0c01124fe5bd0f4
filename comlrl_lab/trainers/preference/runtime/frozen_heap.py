"""Keep the objects that exist before a training step out of the garbage collector's full passes during it.

CPython's cyclic collector (3.10-3.13) runs a full pass over its oldest generation once ten passes of the middle
one have run and the objects they promoted since the last full pass exceed a quarter of those that survived it.
Importing torch and transformers and loading the models leaves about 420,000 tracked objects there, and a step
allocates enough (token lists, pairs, records) to set off a full pass that walks all of them: in the tiny model's
32-item MADPOIter run, one pass of 0.28 s in a ``train()`` of about 7.5 s, every run. None of those objects is the
step's garbage.

``frozen_heap()`` first collects the young generations (so the garbage made since the last step is not frozen with
the rest), then moves every tracked object into the permanent generation (``gc.freeze``) for the span of the step,
and back into the oldest one (``gc.unfreeze``) after it. The passes during the step walk only what the step made.
Nothing changes in what is computed, and memory freed by reference counting (tensors, nearly everything) is freed
at once either way. Two things wait: an older object that becomes cyclic garbage during a step is collected only by
a full pass outside every step (between the workbench's steps, after ``train()``), and a ``gc.collect()`` called
during a step does not reach it. A full pass inside a step also leaves the collector counting only the step's
survivors as the old generation, so the first full pass after the step comes sooner than it would have.

The freeze is the process's: nested or concurrent steps (two runs in one process) share one, undone when the last
of them ends. A process that froze objects itself (a pre-forking server, say) is left alone; objects it freezes while
a step holds the freeze are thawed with it. On 3.14 and later, and on free-threaded builds, the collector works
differently (incremental passes; freezing walks the whole heap), so nothing is done there.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
import sysconfig
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_holders = 0  # steps inside frozen_heap() now, across threads
_froze = False  # whether this module's gc.freeze() is the one in force


@functools.cache  # asked at every step; the interpreter does not change
def supported() -> bool:
    """Whether this interpreter's collector is the generational one the freeze is measured on (3.10-3.13, GIL)."""
    return sys.version_info < (3, 14) and not sysconfig.get_config_var("Py_GIL_DISABLED")


@contextlib.contextmanager
def frozen_heap(enabled: bool = True) -> Iterator[bool]:
    """Freeze the tracked objects for the block (see the module's docstring); yields whether they are frozen by us.

    With ``enabled`` False, on an interpreter ``supported()`` rejects, or when the process had already frozen objects
    before the first holder entered, it does nothing and yields False.
    """
    global _holders, _froze
    if not (enabled and supported()):
        yield False
        return
    if _holders == 0:  # unlocked: a collection can run finalizers, which must not wait on the lock
        gc.collect(1)
    held = False
    try:
        with _lock:
            if _holders == 0 and gc.get_freeze_count() == 0:
                gc.freeze()
                _froze = True
            _holders += 1
            held = True
            frozen = _froze
        yield frozen
    finally:
        if held:
            with _lock:
                _holders -= 1
                if _holders == 0 and _froze:
                    gc.unfreeze()
                    _froze = False
