"""Keep the objects that exist before a training phase out of the garbage collector's full passes during it.

CPython's cyclic collector runs a full pass (generation 2) once the objects promoted since the last one exceed a
quarter of those already there. Importing torch and transformers and loading the models leaves about 420,000
tracked objects in the oldest generation, and a phase allocates enough (token lists, pairs, records) to set off a
full pass that walks all of them: in the tiny model's 32-item MADPOIter run, one pass of 0.28 s in a ``train()`` of
about 7.5 s, every run. None of those objects is the phase's garbage.

``frozen_heap()`` moves every tracked object into the permanent generation (``gc.freeze``) for the span of a phase
and back into the oldest one (``gc.unfreeze``) after it, so the passes during the phase walk only what the phase
made. Nothing changes in what is computed. The phase's own garbage is collected as before; an older object that
becomes cyclic garbage during the phase is collected by the first full pass after it. Memory freed by reference
counting (tensors, nearly everything) is freed at once either way.

The freeze is the process's: nested or concurrent phases (two runs in one process) share one, undone when the last
of them ends. A process that froze objects itself (a pre-forking server, say) is left alone.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_holders = 0  # phases inside frozen_heap() now, across threads
_froze = False  # whether this module's gc.freeze() is the one in force


@contextlib.contextmanager
def frozen_heap(enabled: bool = True) -> Iterator[bool]:
    """Freeze the tracked objects for the block (see the module's docstring); yields whether they are frozen by us.

    With ``enabled`` False, or when the process had already frozen objects before the first holder entered, it
    does nothing and yields False.
    """
    global _holders, _froze
    if not enabled:
        yield False
        return
    with _lock:
        if _holders == 0 and gc.get_freeze_count() == 0:
            gc.freeze()
            _froze = True
        _holders += 1
        frozen = _froze
    try:
        yield frozen
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0 and _froze:
                gc.unfreeze()
                _froze = False
