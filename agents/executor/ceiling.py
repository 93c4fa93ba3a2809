"""The GPU ceiling on the executor's own clock: a grant carries the job's GPU-seconds left when it was made
(``RunJob.remaining_gpu_seconds``); from the training process's start the agent charges ``devices x monotonic
elapsed`` locally and, once that reaches its share, starts the same checkpoint-first stop a ceiling stop
directive would (reason ``gpu_ceiling``), without waiting for heartbeats, the budget service or the broker.

The budget service stays the authority: it still charges the usage reports, publishes ``exhausted`` and the
queue's stop directive for a run already stopping is harmless. Workers of a gang run side by side, so each one's
share of what is left is ``remaining / world_size``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

CEILING_STOP = "gpu_ceiling"  # as the queue's lifecycle.CEILING_STOP and the budget's reason


def seconds_left(devices: int, elapsed: float, remaining: float | None, world_size: int = 1) -> float | None:
    """Wall seconds until this worker has spent its share of ``remaining`` GPU-seconds, running on ``devices``
    (a CPU-only worker counts as one) for ``elapsed`` seconds so far; 0 when spent, None when unknown."""
    if remaining is None:
        return None
    share = remaining / max(1, world_size)
    return max(0.0, share / max(1, devices) - elapsed)


def stop_now(devices: int, elapsed: float, remaining: float | None, world_size: int = 1) -> bool:
    """Has this worker spent its share of the GPU-seconds left at grant time? Never when unknown (None)."""
    left = seconds_left(devices, elapsed, remaining, world_size)
    return left is not None and left <= 0.0


async def watch(devices: int, started_at: float, remaining: float | None, world_size: int,
                clock: Callable[[], float], on_spent: Callable[[], None]) -> bool:
    """Sleep until the share is spent (by ``clock``, monotonic, from ``started_at``), then call ``on_spent``
    once; True when it did. Returns at once (False) when nothing is known. Re-reads the clock after each sleep,
    so an early wake-up never stops early."""
    while True:
        left = seconds_left(devices, clock() - started_at, remaining, world_size)
        if left is None:
            return False
        if left <= 0.0:
            on_spent()
            return True
        await asyncio.sleep(left)
