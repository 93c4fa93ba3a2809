"""An executor is free to placement as soon as it reports its run's end, not at its next heartbeat
(services/queue/executors.free_ended, called by runs.py): before, an executor whose heartbeat named a run stayed
busy until its next heartbeat, up to a whole interval (30 s by default) of idle GPU after every long job."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from libs.contracts.commands import SubmitJob
from libs.contracts.jobs import JobSpec
from libs.contracts.telemetry import LEAVING_STOP, SHUTDOWN_STOP, RunOutcome
from libs.runtime.service import Runtime
from services.queue import executors
from services.queue.settings import QueueSettings
from services.queue.store import SCHEMA
from tests.integration.helpers_queue import FakeExecutor, client, queue_service
from tests.support.services import eventually

pytestmark = pytest.mark.integration
T0 = datetime(2026, 12, 2, 1, 0, tzinfo=UTC)


def beat(job: str | None, epoch: int | None, at: datetime) -> tuple:
    return ("ex-1", "node-ex-1", "g", 0, job is None, job, epoch, "training" if job else "idle", at, at, None, "", None)


async def test_a_reported_end_frees_the_executor_its_heartbeat_named_and_an_older_heartbeat_does_not_undo_it(env):
    rt = await Runtime.open("queue", env.settings(QueueSettings), schema=SCHEMA, package="services.queue")
    try:
        async with rt.pool.acquire() as conn:
            row = lambda: conn.fetchrow("SELECT job_id, epoch, accepting, phase, sent_at FROM queue.executors")  # noqa: E731
            await executors.upsert_executors(conn, [beat("j1", 1, T0)])
            ended = T0 + timedelta(seconds=10)
            assert await executors.free_ended(conn, [("ex-1", "j2", 1, ended, False)]) == 0  # not the run it names
            assert await executors.free_ended(conn, [("ex-1", "j1", 2, ended, False)]) == 0  # nor another epoch
            assert (await row())["job_id"] == "j1"
            assert await executors.free_ended(conn, [("ex-1", "j1", 1, ended, False)]) == 1
            assert tuple(await row()) == (None, None, True, "idle", ended)
            await executors.upsert_executors(conn, [beat("j1", 1, ended - timedelta(seconds=1))])  # sent during the run
            assert (await row())["job_id"] is None
            await executors.upsert_executors(conn, [beat("j3", 1, ended + timedelta(seconds=1))])  # a later one wins
            assert (await row())["job_id"] == "j3"
            # An executor that stopped its run to leave (its allocation ends) is idle, and takes no more work.
            assert await executors.free_ended(conn, [("ex-1", "j3", 1, ended + timedelta(seconds=2), True)]) == 1
            assert tuple(await row())[:4] == (None, None, False, "idle")
    finally:
        await rt.close()


async def test_an_executor_that_reports_its_end_gets_the_next_job_with_no_idle_heartbeat(env):
    # Heartbeats every 30 s as far as the queue knows (so the executor stays fresh without one): before, the
    # waiting job would have been placed only at the executor's next heartbeat.
    settings = env.settings(QueueSettings, heartbeat_seconds=30.0, lease_seconds=180.0, schedule_interval_seconds=30.0)
    async with queue_service(settings), client(settings) as c:
        ex = await FakeExecutor(c, "ex-1").start()
        try:
            first, second = SubmitJob(actor="ann", spec=JobSpec(workload={"kind": "command", "command": ["true"]})), \
                SubmitJob(actor="ann", spec=JobSpec(workload={"kind": "command", "command": ["true"]}))
            assert (await c.command(first)).accepted
            await ex.take(timeout=15)
            ex.beating = False
            await ex.heartbeat_once()  # busy with the first job: the last heartbeat the queue gets
            await eventually(lambda: c.db.fetchval("SELECT job_id FROM queue.executors WHERE executor_id = 'ex-1'"),
                             what="the busy heartbeat")
            assert (await c.command(second)).accepted
            await asyncio.sleep(0.5)
            assert ex.directives.empty()  # busy: the second waits
            await ex.finish(RunOutcome.SUCCEEDED, exit_code=0)
            run = await ex.take(timeout=10)  # well before any tick or heartbeat could have placed it
            assert run.job_id == second.job_id
        finally:
            await ex.stop()


@pytest.mark.parametrize(("outcome", "reason"), [(RunOutcome.STOPPED, LEAVING_STOP),
                                               (RunOutcome.ABANDONED, SHUTDOWN_STOP)], ids=["slurm-leaving", "shutdown"])
async def test_an_executor_that_ended_its_run_to_leave_is_granted_nothing_more(env, outcome, reason):
    # A Slurm pilot whose allocation ends checkpoints and stops its run (stop_reason LEAVING_STOP), an agent told
    # to shut down abandons it (SHUTDOWN_STOP): before, the queue freed it like any executor that reported its end
    # and granted it the next job, which the leaving agent handed back (seen as a flaky Slurm test) or never saw
    # (a whole lease lost). Its job goes to another executor instead.
    settings = env.settings(QueueSettings, heartbeat_seconds=30.0, lease_seconds=180.0, schedule_interval_seconds=30.0)
    async with queue_service(settings), client(settings) as c:
        leaving = await FakeExecutor(c, "ex-1").start()
        other = None
        try:
            job = SubmitJob(actor="ann", spec=JobSpec(workload={"kind": "command", "command": ["true"]}))
            assert (await c.command(job)).accepted
            await leaving.take(timeout=15)
            leaving.beating = False  # a leaving agent's heartbeats say "not accepting"; here it sends none at all
            await leaving.heartbeat_once()
            await eventually(lambda: c.db.fetchval("SELECT job_id FROM queue.executors WHERE executor_id = 'ex-1'"),
                             what="the busy heartbeat")
            await leaving.finish(outcome, stop_reason=reason, last_step=3)
            await eventually(lambda: c.db.fetchval("SELECT state = 'queued' FROM queue.jobs WHERE id = $1",
                                                   job.job_id), what="the job requeued")
            row = await c.db.fetchrow("SELECT job_id, accepting FROM queue.executors WHERE executor_id = 'ex-1'")
            assert tuple(row) == (None, False)
            other = await FakeExecutor(c, "ex-2").start()
            run = await other.take(timeout=15)
            assert run.job_id == job.job_id
            assert leaving.directives.empty()
        finally:
            await leaving.stop()
            if other is not None:
                await other.stop()
