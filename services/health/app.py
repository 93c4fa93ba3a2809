"""The health service process: consumers, the signal evaluator and the outbox relay (wiring only); the
consumers are the subscribers of its FastStream app (libs/runtime/edge_stream.py)."""

from __future__ import annotations

import asyncio
import logging

from libs.runtime.gctune import tune_for_batches
from libs.runtime.outbox import OutboxRelay
from libs.runtime.service import Runtime, wait_forever
from libs.runtime.singleton import periodic
from libs.runtime.unit import Units
from libs.runtime.wake import Waker, channel, wakeable

from . import store
from .checks import Checks
from .evaluator import Evaluator
from .handlers import Counters, HeartbeatLog, consumers
from .settings import HealthSettings

log = logging.getLogger(__name__)


async def serve(settings: HealthSettings | None = None, *, ready: asyncio.Event | None = None) -> None:
    settings = settings or HealthSettings.from_env()
    runtime = await Runtime.open("health", settings, schema=store.SCHEMA, package="services.health")
    try:
        # Consumers share their durables with every replica; the evaluator and the relay run in one.
        relay = OutboxRelay(runtime.pool, store.SCHEMA, runtime.js, bury=runtime.bury)
        checks = Checks(runtime, settings, kick=relay.kick)
        # Heartbeat batches of 500 decoded messages, evaluator passes (libs/runtime/gctune.py); before the
        # consumers start, since its full collection holds the event loop (docs/performance.md, the eighth round).
        tune_for_batches()
        counters = Counters()
        units = Units(runtime.pool, store.SCHEMA, runtime.subjects, counters.stale)
        await runtime.provide(heartbeats=HeartbeatLog(units, runtime.subjects), checks=checks, counters=counters)
        await runtime.consume(consumers(runtime.subjects, settings))

        evaluator = Evaluator(runtime.pool, runtime.subjects, settings.thresholds, runtime.clock)
        # A pass starts as soon as a heartbeat batch is stored (a notification from its transaction, whichever
        # replica stored it; passes take at most half the time while batches keep coming), and every evaluate
        # interval besides, for the silences and standing steps that no message announces.
        waker = Waker(settings.database_url, channel(settings.subject_prefix, store.EVALUATOR))
        runtime.singleton("health-evaluator", wakeable(evaluator.run_pass, settings.evaluate_interval_seconds,
                                                       "health evaluator", waker))
        runtime.singleton("health-checks", periodic(checks.tick, settings.check_interval_seconds, "check loop"))
        runtime.singleton("health-outbox", relay.run)
        if ready is not None:
            ready.set()
        await wait_forever()
    finally:
        await runtime.close()
