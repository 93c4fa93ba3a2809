"""The cyclic garbage collector tuned for a service that holds a whole batch of parsed messages at a time.

CPython collects its youngest generation each time 700 more container objects (dicts, lists, tuples) have been
allocated than freed, and the middle one every tenth time. A consumer holding a batch of a thousand parsed
payloads (a few dozen containers each) crosses that every few messages, and every collection of the middle
generation walks the whole batch again: the audit's read and hashing of 20,000 commands in batches of 1,000
took 78-79 us of CPU a row with the default thresholds and 64-70 us with these (docs/performance.md). Nearly nothing a batch allocates is cyclic; reference counting frees
it when the batch is done. ``tune_for_batches`` raises the youngest generation's threshold (cycles are still
collected, later) and freezes what the service built at start-up (modules, schemas, settings), which no
collection needs to walk again. Opt-in per service, called once when it is ready.
"""

from __future__ import annotations

import gc

BATCH_GEN0_THRESHOLD = 20_000


def tune_for_batches(gen0: int = BATCH_GEN0_THRESHOLD) -> tuple[int, int, int]:
    """Freeze what exists now and collect the youngest generation after ``gen0`` net allocations; returns the
    thresholds as they were."""
    before = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(max(gen0, before[0]), *before[1:])
    return before
