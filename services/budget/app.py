"""The budget service process: ledger consumers, the status responder and the outbox relay (wiring only)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from libs.runtime.outbox import OutboxRelay
from libs.runtime.service import Runtime, wait_forever

from . import store
from .handlers import Counters, consumers, serve_status
from .settings import BudgetSettings


def until(stop: asyncio.Event, body: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    """Run ``body`` until ``stop`` is set. SingletonLoop does not cancel its body when it is itself
    cancelled, so without this a closed service's loops would keep running on a closed pool."""
    async def run() -> None:
        task = asyncio.create_task(body())
        waiter = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, waiter):
                t.cancel()
            await asyncio.gather(task, waiter, return_exceptions=True)

    return run


async def serve(settings: BudgetSettings | None = None, *, ready: asyncio.Event | None = None) -> None:
    settings = settings or BudgetSettings.from_env()
    runtime = await Runtime.open("budget", settings, schema=store.SCHEMA, package="services.budget")
    stop = asyncio.Event()
    try:
        relay = OutboxRelay(runtime.pool, store.SCHEMA, runtime.js)
        # Consumers share their durables with every replica; the relay runs in one.
        for c in consumers(runtime, settings, Counters(), relay):
            await c.subscribe()
            runtime.background(c.run(), c.durable)
        await serve_status(runtime, settings)
        runtime.singleton("budget-outbox", until(stop, relay.run))
        if ready is not None:
            ready.set()
        await wait_forever()
    finally:
        stop.set()
        await runtime.close()
