"""Running a service's ``serve()`` in the test's event loop, and waiting on a condition."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any


async def eventually(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition",
                     every: float = 0.05) -> Any:
    """Call ``check()`` (plain or async) until it returns something truthy (returned), or fail naming ``what``
    and the last value. The one way tests wait: for a condition, never for a duration."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = check()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last value: {last!r}")
        await asyncio.sleep(every)


@contextlib.asynccontextmanager
async def running(serve: Callable[..., Awaitable[None]], settings: Any, *,
                  ready_within: float = 60.0) -> AsyncIterator[asyncio.Task]:
    """``serve(settings, ready=...)`` (a service or an agent) as a task until the block ends; fails with what
    made ``serve`` end, or if it is not ready within ``ready_within`` seconds. The one way tests serve."""
    ready = asyncio.Event()
    task = asyncio.create_task(serve(settings, ready=ready))
    waiter = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait({task, waiter}, timeout=ready_within, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        task.result()  # raises what made serve() end
    if waiter not in done:
        waiter.cancel()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise AssertionError(f"{getattr(serve, '__module__', 'service')} not ready within {ready_within:g}s")
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
