"""The placement benchmark's count of garbage collections within a pass (``bench_placement.CollectorPauses``):
every collection while it is installed is counted and timed, none after it is removed."""

from __future__ import annotations

import gc

import pytest

from bench.bench_placement import CollectorPauses

pytestmark = pytest.mark.unit


def test_collections_while_installed_are_counted_and_timed_and_none_after():
    with CollectorPauses() as pauses:
        gc.collect()
        gc.collect(0)
    assert pauses.count == 2 and pauses.ms > 0 and pauses not in gc.callbacks
    gc.collect()
    assert pauses.count == 2
