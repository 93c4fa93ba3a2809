"""A run's disk limit over all its files (``JobSpec.limits.disk_mb``): ``RLIMIT_FSIZE`` bounds each file the run
writes (limits.py); this watch bounds their sum. Every ``interval`` seconds the agent adds up the space its
directories use (blocks allocated, so a sparse file counts for what it holds) and, once the run has grown them by
more than its limit since it started, ends it with the reason. A run can overshoot by what it writes within one
interval; the world-writable directories (``/tmp``, ``/dev/shm``) are not counted (what a per-run uid leaves
there is removed at the run's end, sandbox.py).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from pathlib import Path

MIB = 1 << 20


def outermost(roots: Iterable[Path]) -> list[Path]:
    """``roots`` without those inside another of them (a run's tmp/ is in its work dir: counted once) (pure)."""
    paths = [Path(r) for r in roots]
    return [p for p in paths if not any(o != p and o in p.parents for o in paths)]


def used_bytes(roots: Iterable[Path]) -> int:
    """Bytes allocated to the files and directories under ``roots`` (links not followed; vanishing files skipped)."""
    total = 0
    for root in outermost(roots):
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                try:
                    total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
                except OSError:
                    continue
    return total


def over(grown: int, limit_mb: int) -> str | None:
    """The reason to end a run that grew its directories by ``grown`` bytes under a ``limit_mb`` limit (pure)."""
    if grown <= limit_mb * MIB:
        return None
    return (f"stopped by its disk limit: its files grew by {grown / MIB:.1f} MiB, more than its {limit_mb} MiB "
            "(limits.disk_mb)")


async def watch(roots: list[Path], limit_mb: int | None, interval: float, on_over: Callable[[str], None]) -> None:
    """Until cancelled, or until the run's files grow past ``limit_mb`` (then ``on_over(reason)`` once)."""
    if limit_mb is None:
        return
    start = await asyncio.to_thread(used_bytes, roots)
    while True:
        await asyncio.sleep(interval)
        why = over(await asyncio.to_thread(used_bytes, roots) - start, limit_mb)
        if why is not None:
            on_over(why)
            return
