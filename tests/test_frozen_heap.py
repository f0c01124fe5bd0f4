"""frozen_heap: a step's garbage-collector passes skip the objects older than the step, and the freeze is undone."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from comlrl_lab.trainers.preference.runtime import frozen_heap as module
from comlrl_lab.trainers.preference.runtime.frozen_heap import frozen_heap, supported

pytestmark = pytest.mark.skipif(not supported(), reason="the freeze is for CPython 3.10-3.13's generational collector")


class Node:
    """A weak-referenceable object that can sit in a reference cycle."""

    def __init__(self):
        self.other = None


def cycle() -> weakref.ref:
    """Two objects that refer to each other, only reachable through the cycle once the caller drops them."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def tracked(obj) -> bool:
    """Whether the collector's generations hold ``obj``: ``gc.get_objects`` leaves out the frozen ones."""
    return any(o is obj for o in gc.get_objects())


@pytest.fixture(autouse=True)
def unfrozen():
    gc.collect()
    assert gc.get_freeze_count() == 0
    assert module._holders == 0  # no step of another test is still running
    yield
    gc.unfreeze()  # whatever a failing test left
    module._holders, module._froze = 0, False


def test_objects_older_than_the_block_are_frozen_and_thawed_after_it():
    old = Node()
    with frozen_heap() as frozen:
        assert frozen
        assert gc.get_freeze_count() > 0
        new = Node()
        assert not tracked(old)
        assert tracked(new)
    assert gc.get_freeze_count() == 0
    assert tracked(old)
    assert any(o is old for o in gc.get_objects(2))  # back in the oldest generation


def test_an_exception_in_the_block_thaws_the_objects_and_propagates():
    old = Node()
    with pytest.raises(ValueError, match="boom"), frozen_heap():
        raise ValueError("boom")
    assert gc.get_freeze_count() == 0
    assert module._holders == 0
    assert tracked(old)


def test_a_cycle_made_in_the_block_is_collected_in_it_and_an_older_one_only_after_it():
    older = cycle()
    holder = [older()]  # keeps the older cycle alive until inside the block
    with frozen_heap():
        holder.clear()  # the older cycle is garbage now, but frozen
        newer = cycle()
        gc.collect()
        assert newer() is None
        assert older() is not None
    gc.collect()
    assert older() is None


def test_an_interpreter_with_another_collector_freezes_nothing(monkeypatch):
    monkeypatch.setattr(module, "supported", lambda: False)
    with frozen_heap() as frozen:
        assert not frozen
        assert gc.get_freeze_count() == 0


def test_young_cyclic_garbage_is_collected_before_the_freeze_not_frozen_with_the_rest():
    young = cycle()  # garbage already, but no pass has run since it was made
    with frozen_heap():
        assert young() is None


def test_a_disabled_block_freezes_nothing():
    with frozen_heap(enabled=False) as frozen:
        assert not frozen
        assert gc.get_freeze_count() == 0


def test_a_nested_block_leaves_the_outer_freeze_in_force():
    with frozen_heap():
        with frozen_heap() as inner:
            assert inner
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_a_block_in_another_thread_does_not_thaw_this_ones_freeze():
    entered, release = threading.Event(), threading.Event()

    def other():
        with frozen_heap():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    try:
        with frozen_heap():
            thread.start()
            assert entered.wait(10)
        assert gc.get_freeze_count() > 0  # the other thread's block still holds it
    finally:
        release.set()
        thread.join(10)
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_objects_itself_keeps_them_frozen(monkeypatch):
    # Frozen objects that die during the block leave the count (other threads of a test worker free some), so what
    # is checked is that the block neither freezes nor unfreezes: the process's frozen objects stay frozen.
    freeze, unfreeze = gc.freeze, gc.unfreeze
    freeze()
    calls: list[str] = []
    try:
        monkeypatch.setattr(module.gc, "freeze", lambda: calls.append("freeze"))
        monkeypatch.setattr(module.gc, "unfreeze", lambda: calls.append("unfreeze"))
        with frozen_heap() as frozen:
            assert not frozen
        assert calls == [] and gc.get_freeze_count() > 0
    finally:
        monkeypatch.undo()
        unfreeze()  # the objects this test froze must not stop the next tests' blocks from freezing


@pytest.mark.parametrize(("enabled", "frozen_in_phases"), [(True, True), (False, False)])
def test_a_trainer_runs_each_step_frozen_when_the_field_is_on(
    make_trainer, tmp_path, monkeypatch, enabled, frozen_in_phases
):
    trainer = make_trainer("MADPO", tmp_path, gc_freeze_during_steps=enabled)
    run_phase, counts = trainer._run_phase, []

    def counted(phase, records):
        counts.append(gc.get_freeze_count())
        return run_phase(phase, records)

    monkeypatch.setattr(trainer, "_run_phase", counted)
    while not trainer.finished:
        trainer.step()
        assert gc.get_freeze_count() == 0  # thawed between steps
    assert len(counts) == len(trainer.history) > 0
    assert all((count > 0) == frozen_in_phases for count in counts)


def test_train_holds_one_freeze_over_every_step_and_thaws_after(make_trainer, tmp_path, monkeypatch):
    trainer = make_trainer("MADPO", tmp_path)
    step, counts = trainer.step, []

    def counted():
        counts.append(gc.get_freeze_count())  # between steps, still frozen
        return step()

    monkeypatch.setattr(trainer, "step", counted)
    trainer.train()
    assert len(counts) == len(trainer.history) > 1
    assert all(count > 0 for count in counts)
    assert gc.get_freeze_count() == 0
