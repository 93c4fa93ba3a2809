"""``tune_for_batches`` (libs/runtime/gctune.py): what exists when a service is ready is frozen out of every
collection, the youngest generation is collected after many more net allocations (never fewer than before), the
older thresholds are kept, and a cycle is still collected."""

from __future__ import annotations

import gc
import weakref

import pytest

from libs.runtime.gctune import BATCH_GEN0_THRESHOLD, tune_for_batches

pytestmark = pytest.mark.unit


@pytest.fixture
def restored():
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)
    gc.unfreeze()


def test_start_up_objects_are_frozen_and_the_youngest_generation_waits_longer(restored):
    gc.set_threshold(700, 10, 10)
    assert tune_for_batches() == (700, 10, 10)
    assert gc.get_threshold() == (BATCH_GEN0_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() > 0


def test_a_higher_threshold_already_set_is_kept(restored):
    gc.set_threshold(50_000, 5, 5)
    tune_for_batches()
    assert gc.get_threshold() == (50_000, 5, 5)


def test_a_cycle_made_after_tuning_is_still_collected_without_being_asked(restored):
    tune_for_batches()

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    assert gone() is not None  # a cycle: reference counting alone does not free it
    held = [[] for _ in range(BATCH_GEN0_THRESHOLD + 1_000)]  # past the threshold: a collection runs by itself
    assert gc.isenabled() and gone() is None and held
