"""A fetched batch of run reports applied in one queue transaction (``Runs.progress_all``), against real
PostgreSQL and NATS: each job's reports in their order (a checkpoint before the finish that follows it), two
jobs' reports interleaved, a forged and a stale report among them refused or ignored alone, the accepted steps
recorded, and the round trips of a batch not growing with its size."""

from __future__ import annotations

import pytest

from libs.contracts.commands import SubmitJob
from libs.contracts.envelope import utcnow
from libs.contracts.jobs import JobSpec
from libs.contracts.nodes import NodeEvent
from libs.contracts.telemetry import CheckpointReport, Heartbeat, RunFinished, RunOutcome, RunStarted, StepReport
from libs.runtime.fencing import StaleCounter
from libs.runtime.service import Runtime
from libs.runtime.unit import Units
from services.queue.commands import Commands
from services.queue.domain import lifecycle as lc
from services.queue.runs import Runs
from services.queue.scheduler import Scheduler
from services.queue.settings import QueueSettings
from services.queue.store import SCHEMA
from tests.support.countingdb import CountingPool

pytestmark = pytest.mark.integration


async def running(env, n: int) -> tuple[QueueSettings, Runtime, list[str]]:
    """``n`` jobs granted to executors ex-0.. (epoch 1), through the queue's own submit and placement."""
    settings = env.settings(QueueSettings)
    runtime = await Runtime.open("queue", settings, schema=SCHEMA, package="services.queue")
    commands, runs = Commands(runtime, settings), Runs(runtime, settings)
    jobs = [f"job-{i}" for i in range(n)]
    for job_id in jobs:
        spec = JobSpec(workload={"kind": "finetune", "params": {"steps": 20}})
        assert (await commands.submit(SubmitJob(actor="ann", job_id=job_id, spec=spec))).accepted
    await runs.heartbeats([Heartbeat(executor_id=f"ex-{i}", node_id=f"n{i}", group="g", sent_at=utcnow(),
                                     interval_seconds=1, progress_interval_seconds=1) for i in range(n)])
    for i in range(n):
        await runs.node_event(NodeEvent(node_id=f"n{i}", seq=1, event="ready", state="ready", executor_id=f"ex-{i}",
                                        group="g", schedulable=True))
    while await Scheduler(runtime, settings).place_once():
        pass
    owners = dict(await runtime.pool.fetch("SELECT id, executor_id FROM queue.jobs WHERE state = 'running'"))
    assert sorted(owners) == jobs
    return settings, runtime, [owners[j] for j in jobs]


def whole_run(job_id: str, executor_id: str) -> list:
    common = dict(job_id=job_id, epoch=1, executor_id=executor_id)
    return [RunStarted(**common, device="cpu"), StepReport(**common, step=10, total_steps=20, step_seconds=0.25),
            CheckpointReport(**common, step=10, path="/ck/10.pt", sha256="ab", bytes=5),
            RunFinished(**common, outcome=RunOutcome.SUCCEEDED, exit_code=0, last_step=20)]


async def test_a_batch_applies_each_jobs_reports_in_order_in_one_transaction(env):
    settings, runtime, owners = await running(env, 2)
    try:
        runs = Runs(runtime, settings)
        a, b = whole_run("job-0", owners[0]), whole_run("job-1", owners[1])
        forged = StepReport(job_id="job-1", epoch=1, executor_id="ex-9", step=99, total_steps=20, step_seconds=1)
        stale = StepReport(job_id="job-0", epoch=2, executor_id=owners[0], step=5, total_steps=20, step_seconds=1)
        batch = [a[0], b[0], a[1], forged, a[2], b[1], stale, b[2], a[3], b[3]]
        results = await runs.progress_all(batch)
        assert isinstance(results[3], lc.ForeignReport)  # refused alone, the others applied
        assert isinstance(results[6], lc.Transition) and results[6].stale and runs.stale.count == 1
        for job_id in ("job-0", "job-1"):
            job = await runtime.pool.fetchrow("SELECT state, last_step, last_checkpoint FROM queue.jobs WHERE id = $1",
                                              job_id)
            assert job["state"] == "succeeded" and job["last_step"] == 20
            rows = await runtime.pool.fetch(
                "SELECT event, seq, xmin::text AS tx FROM queue.job_events WHERE job_id = $1 ORDER BY seq", job_id)
            assert [r["event"] for r in rows] == ["submitted", "leased", "started", "checkpointed", "succeeded"]
            assert [r["seq"] for r in rows] == [1, 2, 3, 4, 5]
            assert len({r["tx"] for r in rows[2:]}) == 1  # the whole batch: one transaction
        steps = await runtime.pool.fetch("SELECT job_id, step FROM queue.job_steps ORDER BY job_id")
        assert [(r["job_id"], r["step"]) for r in steps] == [("job-0", 10), ("job-1", 10)]  # not the forged one
        # each job's events went to the outbox in its order
        subjects = [r["subject"] for r in await runtime.pool.fetch(
            "SELECT subject FROM queue.outbox WHERE subject LIKE $1 ORDER BY id",
            f"{settings.subject_prefix}.job.job-0.%")]
        assert [s.rsplit(".", 1)[1] for s in subjects] == ["submitted", "leased", "started", "checkpointed",
                                                           "succeeded"]
        # a redelivered batch changes nothing (every fact is old news now)
        again = await runs.progress_all(batch)
        assert all(not r.changed for r in again if isinstance(r, lc.Transition))
        assert await runtime.pool.fetchval("SELECT count(*) FROM queue.job_events") == 10
    finally:
        await runtime.close()


async def test_the_round_trips_of_a_report_batch_do_not_grow_with_its_size(env):
    settings, runtime, owners = await running(env, 6)
    try:
        counting = CountingPool(runtime.pool)
        runs = Runs(runtime, settings, Units(counting, SCHEMA, runtime.subjects, StaleCounter("queue")))
        trips = {}
        for size, jobs in ((1, [0]), (5, [1, 2, 3, 4, 5])):
            counting.reset()
            batch = [r for j in jobs for r in whole_run(f"job-{j}", owners[j])[:2]]  # started, a step
            await runs.progress_all(batch)
            trips[size] = counting.counts["round_trips"]
        # BEGIN, the jobs locked, the jobs, their events with the outbox, the steps, COMMIT
        assert trips == {1: 6, 5: 6}, trips
    finally:
        await runtime.close()
