"""Running a service's ``serve()`` in the test's event loop, and waiting on a condition."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from libs.runtime.tasks import stop_tasks


Failures = tuple[type[BaseException], ...]


class _Wait:
    """The rule both waiting helpers share: the deadline, the errors that count as "not yet", and the failure
    naming what was awaited and the last value (or error) seen."""

    def __init__(self, timeout: float, what: str | Callable[[], str], ignoring: Failures) -> None:
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.what = what
        self.ignoring = ignoring

    def give_up_on(self, last: Any) -> None:
        if time.monotonic() >= self.deadline:
            what = self.what() if callable(self.what) else self.what
            raise AssertionError(f"timed out after {self.timeout:g}s waiting for {what}; last value: {last!r}")


async def eventually(check: Callable[[], Any], timeout: float = 10.0, what: str | Callable[[], str] = "condition",
                     every: float = 0.05, ignoring: Failures = ()) -> Any:
    """Call ``check()`` (plain or async) until it returns something truthy (returned), or fail naming ``what``
    (a text, or a function giving it when the wait fails: a log's tail) and the last value. An error of a type in
    ``ignoring`` (a server not listening yet) counts as a falsy value. The one way tests wait: for a condition,
    never for a duration."""
    wait = _Wait(timeout, what, ignoring)
    while True:
        try:
            last = check()
            if inspect.isawaitable(last):
                last = await last
        except ignoring as exc:
            last = exc
        else:
            if last:
                return last
        wait.give_up_on(last)
        await asyncio.sleep(every)


def eventually_blocking(check: Callable[[], Any], timeout: float = 10.0, what: str | Callable[[], str] = "condition",
                        every: float = 0.25, ignoring: Failures = ()) -> Any:
    """``eventually`` for plain tests whose checks block (the end-to-end tests, which drive a whole stack)."""
    wait = _Wait(timeout, what, ignoring)
    while True:
        try:
            last = check()
        except ignoring as exc:
            last = exc
        else:
            if last:
                return last
        wait.give_up_on(last)
        time.sleep(every)


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
        await stop_tasks([task], timeout=30)
        raise AssertionError(f"{getattr(serve, '__module__', 'service')} not ready within {ready_within:g}s")
    try:
        yield task
    finally:
        assert not await stop_tasks([task], timeout=30), f"{getattr(serve, '__module__', 'service')} did not stop"
