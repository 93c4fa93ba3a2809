"""Wiring of the queue service: runtime, consumers and responders, singleton loops (outbox relay, placement,
lease scanner, gang scanner). Nothing else lives here. The consumers and responders are the subscribers of the
service's FastStream app (``runtime.consume``/``respond``: libs/runtime/edge_stream.py)."""

from __future__ import annotations

import asyncio
import logging

from libs.contracts.jobs import JobState
from libs.runtime import metrics
from libs.runtime.fencing import StaleCounter
from libs.runtime.gctune import tune_for_batches
from libs.runtime.outbox import OutboxRelay, purge_published
from libs.runtime.service import Runtime, wait_forever
from libs.runtime.singleton import periodic
from libs.runtime.unit import Units
from libs.runtime.wake import Waker, channel, wakeable

from .commands import Commands
from .domain.wakes import PLACEMENT
from .effects import quarantine_hook
from .gangs import GangScanner
from .handlers import consumers, responders
from .policy import Policies
from .tenancy_edge import Tenancy
from .runs import Runs
from .scheduler import Scheduler
from .settings import QueueSettings
from . import store
from .store import SCHEMA

log = logging.getLogger(__name__)
NAME = "queue"
OUTBOX_PURGE_SECONDS = 3600.0


async def serve(settings: QueueSettings | None = None, *, ready: asyncio.Event | None = None) -> None:
    settings = settings or QueueSettings.from_env()
    runtime = await Runtime.open(NAME, settings, schema=SCHEMA, package="services.queue")
    try:
        relay = OutboxRelay(runtime.pool, SCHEMA, runtime.js, bury=runtime.bury,
                            on_quarantine=quarantine_hook(settings, runtime.clock.now))
        # One way to apply facts: each unit's outbox rows leave at once (the relay is kicked after the commit).
        units = Units(runtime.pool, SCHEMA, runtime.subjects, StaleCounter(NAME), kick=relay.kick)
        commands = Commands(runtime, settings, units)
        runs = Runs(runtime, settings, units)
        scheduler = Scheduler(runtime, settings, kick=relay.kick)
        gangs = GangScanner(runtime, settings, kick=relay.kick)
        # What start-up built (modules, schemas) frozen out of every collection, the youngest generation collected
        # less often: a placement pass of 200 grants no longer pays 3-100 ms gen-2 collections walking it all
        # (libs/runtime/gctune.py; docs/performance.md, placement's sixth round). Before the consumers start: its
        # full collection holds the event loop (the eighth round).
        tune_for_batches()
        await runtime.provide(commands=commands, runs=runs, policies=Policies(runtime, units),
                              tenancy=Tenancy(runtime, units))
        await runtime.consume(consumers(runtime.subjects))
        await runtime.respond(responders(runtime.subjects))
        runtime.singleton(f"{NAME}-outbox", relay.run)
        # Placement runs when a job is queued or an executor offers itself (a notification from the committing
        # transaction, whichever replica), and every schedule interval besides.
        waker = Waker(settings.database_url, channel(settings.subject_prefix, PLACEMENT))
        runtime.singleton(f"{NAME}-placement", wakeable(
            scheduler.place_once, settings.schedule_interval_seconds, "placement", waker))
        # A follower tries for the lock every scan interval (at most every second), so when the scanning replica
        # dies another takes over within one scan interval: lease expiry never waits for a restart.
        runtime.singleton(f"{NAME}-lease-scanner", periodic(
            scheduler.scan_once, settings.scan_interval_seconds, "lease scanner"),
            retry_seconds=min(1.0, settings.scan_interval_seconds))
        # Gangs past their ready deadline back off; back-offs that are over are queued again.
        runtime.singleton(f"{NAME}-gang-scanner", periodic(
            gangs.scan_once, settings.scan_interval_seconds, "gang scanner"))
        # Published outbox rows are kept a day (for inspection after an incident), then dropped.
        runtime.singleton(f"{NAME}-outbox-purge", periodic(
            lambda: purge_published(runtime.pool, SCHEMA), OUTBOX_PURGE_SECONDS, "outbox purge"))
        # Jobs by state for the metrics endpoint: every replica samples (a gauge, not a count of facts).
        runtime.background(periodic(lambda: sample_jobs(runtime), settings.metrics_sample_seconds, "jobs sampler")(),
                           "jobs-sampler")
        log.info("queue service ready (prefix %s)", settings.subject_prefix)
        if ready is not None:
            ready.set()
        await wait_forever()
    finally:
        await runtime.close()


async def sample_jobs(runtime: Runtime) -> None:
    counts = await store.jobs_by_state(runtime.pool)
    for state in JobState:
        metrics.JOBS.labels(state.value).set(counts.get(state.value, 0))
