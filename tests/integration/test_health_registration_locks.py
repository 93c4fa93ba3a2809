"""A registration never holds up its executor's heartbeats (services/health/handlers.py ``on_registrations``):
the check loop holds joining nodes' locks, a registration waits for its node's, and while it waited it used to
hold its executor's row, which every heartbeat write and evaluator pass then waited for (issue 12: a fleet
registering made health's heartbeat batches take seconds). The executors are now written last, in key order."""

from __future__ import annotations

import asyncio
import functools
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from libs.contracts.nodes import NodeRegistered
from libs.contracts.telemetry import Heartbeat, Phase
from libs.runtime.service import Runtime
from libs.runtime.unit import Units
from services.health import store
from services.health.checks import Checks
from services.health.handlers import Counters, HeartbeatLog, on_heartbeats, on_registrations
from services.health.settings import HealthSettings
from tests.support.services import eventually

pytestmark = pytest.mark.integration


def registration(boot: str) -> NodeRegistered:
    return NodeRegistered(node_id="node-ex1", executor_id="ex1", group="g1", hostname="h", cpu_count=2,
                          agent_version="t", boot_id=boot)


def handlers(runtime: Runtime, checks: Checks) -> dict[str, Any]:
    """The registration and heartbeat handlers, given what the app puts in its broker's context."""
    units = Units(runtime.pool, store.SCHEMA, runtime.subjects, Counters().stale)
    return {"health-nodes": functools.partial(on_registrations, pool=runtime.pool, clock=runtime.clock,
                                              checks=checks, reporter=runtime, subjects=runtime.subjects),
            "health-heartbeats": functools.partial(on_heartbeats, heartbeats=HeartbeatLog(units, runtime.subjects),
                                                   clock=runtime.clock)}


async def test_a_registration_waiting_for_its_nodes_lock_does_not_hold_up_the_heartbeats(env):
    settings = env.settings(HealthSettings)
    runtime = await Runtime.open("health", settings, schema=store.SCHEMA, package="services.health")
    holder = await asyncpg.connect(env.database_url)
    # Watched from its own connection: pg_stat_activity is a snapshot taken once per transaction, so polled from
    # the holder's (open) transaction it would show forever what it showed first (CI: 0, for 10 s).
    watcher = await asyncpg.connect(env.database_url)
    try:
        handle = handlers(runtime, Checks(runtime, settings))
        await handle["health-nodes"]([registration("b1")])
        hold = holder.transaction()
        await hold.start()
        await holder.execute("SELECT 1 FROM health.nodes WHERE node_id = 'node-ex1' FOR UPDATE")  # the check loop
        again = asyncio.create_task(handle["health-nodes"]([registration("b2")]))
        await eventually(lambda: watcher.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%health.nodes%'"),
            what="the registration waiting for its node")
        beat = Heartbeat(executor_id="ex1", node_id="node-ex1", group="g1", phase=Phase.IDLE,
                         sent_at=datetime.now(UTC), interval_seconds=30, progress_interval_seconds=30,
                         accepting=True)
        await asyncio.wait_for(handle["health-heartbeats"]([beat]), 20)  # not behind the registration
        assert not again.done()
        await hold.rollback()
        await asyncio.wait_for(again, 20)
        row = await holder.fetchrow("SELECT * FROM health.executors WHERE executor_id = 'ex1'")
        assert row["last_heartbeat"] == beat.sent_at and row["registered_at"] is not None
    finally:
        await watcher.close()
        await holder.close()
        await runtime.close()


async def test_the_check_loop_locks_no_joining_node_before_its_join_run_is_due(env):
    # A node held by a registration in progress (here: a lock on its row) does not hold up the loop's tick while
    # no join run is due, and so the loop never makes registrations wait for it either.
    settings = env.settings(HealthSettings, join_batch_seconds=3600)
    runtime = await Runtime.open("health", settings, schema=store.SCHEMA, package="services.health")
    holder = await asyncpg.connect(env.database_url)
    try:
        checks = Checks(runtime, settings)
        handle = handlers(runtime, checks)
        await handle["health-nodes"]([registration("b1")])
        assert await holder.fetchval("SELECT state FROM health.nodes WHERE node_id = 'node-ex1'") == "joining"
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM health.nodes WHERE node_id = 'node-ex1' FOR UPDATE")
            assert await asyncio.wait_for(checks.tick(), 20) == 0
    finally:
        await holder.close()
        await runtime.close()
