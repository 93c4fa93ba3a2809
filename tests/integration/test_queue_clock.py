"""Lease deadlines, gang ready deadlines and their expiry are judged on one clock, PostgreSQL's, whichever queue
replica sets or judges them: two replicas whose own clocks disagree by twenty minutes grant, renew and expire
the same lease at the same moment, and a replica running ahead does not time a forming gang out early."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from libs.contracts.commands import SubmitJob
from libs.contracts.envelope import utcnow
from libs.contracts.jobs import JobSpec
from libs.contracts.leases import LeaseRenewRequest
from libs.contracts.nodes import NodeEvent
from libs.contracts.telemetry import Heartbeat
from libs.runtime.clock import Clock
from libs.runtime.service import Runtime
from services.queue import store
from services.queue.commands import Commands
from services.queue.gangs import GangScanner
from services.queue.runs import Runs
from services.queue.scheduler import Scheduler
from services.queue.settings import QueueSettings
from services.queue.store import SCHEMA
from tests.support.services import eventually


pytestmark = pytest.mark.integration

SKEW = timedelta(minutes=10)


class SkewedClock(Clock):
    """A replica whose wall clock is off by ``skew``."""

    def __init__(self, skew: timedelta) -> None:
        self.skew = skew

    def now(self) -> datetime:
        return datetime.now(UTC) + self.skew


async def test_replicas_whose_clocks_disagree_by_minutes_expire_the_same_lease_at_the_same_time(env):
    settings = env.settings(QueueSettings, lease_seconds=3.0, heartbeat_seconds=1.0, stop_margin_seconds=1.0)
    ahead, behind = [await Runtime.open("queue", settings, schema=SCHEMA, package="services.queue")
                     for _ in range(2)]
    ahead.clock, behind.clock = SkewedClock(SKEW), SkewedClock(-SKEW)
    try:
        runs = Runs(ahead, settings)
        submit = SubmitJob(actor="ann", spec=JobSpec(workload={"kind": "finetune"}))
        assert (await Commands(ahead, settings).submit(submit)).accepted
        await runs.heartbeats([Heartbeat(executor_id="ex-0", node_id="n0", group="g", sent_at=utcnow(),
                                         interval_seconds=1, progress_interval_seconds=1)])
        await runs.node_event(NodeEvent(node_id="n0", seq=1, event="ready", state="ready", executor_id="ex-0",
                                        group="g", schedulable=True))
        # The replica ten minutes behind places: its own clock would have made the executor look silent for
        # ten minutes (never placed) and the lease expired long ago.
        assert await Scheduler(behind, settings).place_once() == 1

        async def deadline() -> datetime:
            return await ahead.pool.fetchval("SELECT lease_expires_at FROM queue.jobs WHERE id = $1",
                                             submit.job_id)

        async def db_now() -> datetime:
            async with ahead.pool.acquire() as conn:
                return await store.db_now(conn)

        granted_until = await deadline()
        assert abs((granted_until - await db_now()) - timedelta(seconds=3)) < timedelta(seconds=2)
        # The replica ten minutes ahead renews: the deadline moves on the database's clock, not ten minutes on.
        reply = await runs.renew(LeaseRenewRequest(job_id=submit.job_id, epoch=1, executor_id="ex-0"))
        assert reply.ok and abs(reply.expires_at - await db_now() - timedelta(seconds=3)) < timedelta(seconds=2)
        renewed_until = await deadline()
        assert renewed_until == reply.expires_at and renewed_until >= granted_until
        # Before the deadline, neither replica expires it (the one ahead would have, at once, on its own clock).
        assert await Scheduler(ahead, settings).scan_once() == 0
        assert await Scheduler(behind, settings).scan_once() == 0
        assert await db_now() < renewed_until

        # After it, the replica behind expires it (on its own clock it would wait ten more minutes).
        async def past_deadline() -> bool:
            return await db_now() > renewed_until

        await eventually(past_deadline, 10)
        assert await Scheduler(behind, settings).scan_once() == 1
        assert await ahead.pool.fetchval("SELECT state FROM queue.jobs WHERE id = $1", submit.job_id) == "queued"
    finally:
        for r in (ahead, behind):
            await r.close()


async def test_a_replica_whose_clock_runs_ahead_does_not_time_out_a_forming_gang_early(env):
    settings = env.settings(QueueSettings, require_checked_nodes=False)
    ahead = await Runtime.open("queue", settings, schema=SCHEMA, package="services.queue")
    ahead.clock = SkewedClock(SKEW)
    try:
        runs = Runs(ahead, settings)
        submit = SubmitJob(actor="ann", spec=JobSpec(workload={"kind": "finetune"}, workers=2))
        assert (await Commands(ahead, settings).submit(submit)).accepted
        await runs.heartbeats([Heartbeat(executor_id=f"ex-{i}", node_id=f"n{i}", group="g", sent_at=utcnow(),
                                         interval_seconds=1, progress_interval_seconds=1) for i in range(2)])
        assert await Scheduler(ahead, settings).place_once() == 1
        row = await ahead.pool.fetchrow("SELECT state, ready_deadline FROM queue.jobs WHERE id = $1", submit.job_id)
        assert row["state"] == "admitting"
        async with ahead.pool.acquire() as conn:
            assert row["ready_deadline"] - await store.db_now(conn) < SKEW  # set on the database's clock
        # Ten minutes ahead, this replica's own clock is past the ready deadline (120 s by default); the
        # database's is not, so the gang keeps forming.
        assert await GangScanner(ahead, settings).scan_once() == 0
        assert await ahead.pool.fetchval("SELECT state FROM queue.jobs WHERE id = $1", submit.job_id) == "admitting"
    finally:
        await ahead.close()
