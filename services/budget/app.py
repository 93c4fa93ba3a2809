"""The budget service process: ledger consumers, the status responder and the outbox relay (wiring only); the
consumers and responders are the subscribers of its FastStream app (libs/runtime/edge_stream.py)."""

from __future__ import annotations

import asyncio

from libs.runtime.gctune import tune_for_batches
from libs.runtime.outbox import OutboxRelay
from libs.runtime.service import Runtime, wait_forever
from libs.runtime.unit import Units

from . import store
from .handlers import Counters, Ledger, consumers, responders
from .settings import BudgetSettings


async def serve(settings: BudgetSettings | None = None, *, ready: asyncio.Event | None = None) -> None:
    settings = settings or BudgetSettings.from_env()
    runtime = await Runtime.open("budget", settings, schema=store.SCHEMA, package="services.budget")
    try:
        relay = OutboxRelay(runtime.pool, store.SCHEMA, runtime.js, bury=runtime.bury)
        # Consumers share their durables with every replica; the relay runs in one.
        # Batches of up to 500 decoded reports and their rows (libs/runtime/gctune.py); before the consumers start,
        # since its full collection holds the event loop (docs/performance.md, the eighth round).
        tune_for_batches()
        # The handlers' ledger and counters, beside the runtime's pool, clock and settings (edge_stream.py); the
        # relay is kicked after each commit: a ceiling reached tells the queue without waiting for its poll.
        counters = Counters()
        units = Units(runtime.pool, store.SCHEMA, runtime.subjects, counters.stale, kick=relay.kick)
        await runtime.provide(ledger=Ledger(units, runtime.subjects), counters=counters)
        await runtime.consume(consumers(runtime.subjects, settings))
        await runtime.respond(responders(runtime.subjects, settings))
        runtime.singleton("budget-outbox", relay.run)
        if ready is not None:
            ready.set()
        await wait_forever()
    finally:
        await runtime.close()
