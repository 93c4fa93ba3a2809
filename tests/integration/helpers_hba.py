"""Helpers for the health, budget and audit integration tests: wait on a condition, run a service's serve()
as a task, and collect what arrives on a subject."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import nats
from nats.aio.msg import Msg


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 10.0, every: float = 0.05) -> Any:
    """Await ``check()`` until it returns something truthy (returned) or raise with its last value."""
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
    ready = asyncio.Event()
    task = asyncio.create_task(serve(settings, ready=ready))
    waiter = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait({task, waiter}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        waiter.cancel()
        task.result()  # raises what made serve() end
    assert waiter in done, "service not ready within 30s"
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class Collector:
    """Core-NATS subscription that keeps every message on a subject pattern."""

    def __init__(self) -> None:
        self.msgs: list[Msg] = []

    async def cb(self, msg: Msg) -> None:
        self.msgs.append(msg)


@contextlib.asynccontextmanager
async def collect(url: str, subject: str) -> AsyncIterator[Collector]:
    nc = await nats.connect(url)
    col = Collector()
    await nc.subscribe(subject, cb=col.cb)
    await nc.flush()
    try:
        yield col
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def jetstream(url: str) -> AsyncIterator[Any]:
    nc = await nats.connect(url)
    try:
        yield nc, nc.jetstream(timeout=10)
    finally:
        await nc.close()
