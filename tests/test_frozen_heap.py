"""frozen_heap: a phase's garbage-collector passes skip the objects older than the phase, and the freeze is undone."""

from __future__ import annotations

import gc
import threading
import weakref

import pytest

from comlrl_lab.trainers.preference.frozen_heap import frozen_heap


class Node:
    """A weak-referenceable object that can sit in a reference cycle."""

    def __init__(self):
        self.other = None


def cycle() -> weakref.ref:
    """Two objects that refer to each other, only reachable through the cycle once the caller drops them."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


@pytest.fixture(autouse=True)
def unfrozen():
    gc.collect()
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()  # whatever a failing test left


def test_objects_older_than_the_block_are_frozen_and_thawed_after_it():
    old = [Node() for _ in range(100)]
    with frozen_heap() as frozen:
        assert frozen
        assert gc.get_freeze_count() >= len(old)
        new = [Node() for _ in range(100)]
        assert all(gc.is_tracked(n) for n in new)
    assert gc.get_freeze_count() == 0


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
    with frozen_heap():
        thread.start()
        entered.wait(10)
    assert gc.get_freeze_count() > 0  # the other thread's block still holds it
    release.set()
    thread.join(10)
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_objects_itself_keeps_them_frozen():
    gc.freeze()
    count = gc.get_freeze_count()
    with frozen_heap() as frozen:
        assert not frozen
    assert gc.get_freeze_count() == count


@pytest.mark.parametrize(("enabled", "frozen_in_phases"), [(True, True), (False, False)])
def test_a_trainer_runs_each_phase_frozen_when_the_field_is_on(
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
        assert gc.get_freeze_count() == 0  # thawed between phases
    assert len(counts) == len(trainer.history) > 0
    assert all((count > 0) == frozen_in_phases for count in counts)
