"""Running a service's ``serve()`` in the test's event loop, and waiting on a condition."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 10.0, every: float = 0.05) -> Any:
    """Await ``check()`` until it returns something truthy (returned) or fail with its last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(every)
    raise AssertionError(f"condition not met within {timeout}s; last value: {last!r}")


@contextlib.asynccontextmanager
async def running(serve: Callable[..., Awaitable[None]], settings: Any) -> AsyncIterator[asyncio.Task]:
    """``serve(settings, ready=...)`` as a task until the block ends; fails if it is not ready within 30 s."""
    ready = asyncio.Event()
    task = asyncio.create_task(serve(settings, ready=ready))
    waiter = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait({task, waiter}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        task.result()  # raises what made serve() end
    assert waiter in done, f"{getattr(serve, '__module__', 'service')} not ready within 30s"
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
