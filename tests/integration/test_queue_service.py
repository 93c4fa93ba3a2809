"""The queue service against real NATS and PostgreSQL, with the test playing the executor agents: a job's whole
path to success, lease expiry and fencing, failures that spend attempts, cancel, the GPU ceiling and requeue,
idempotent commands, and malformed input."""

from __future__ import annotations

import asyncio
import gc
import json

import pytest

from libs.contracts.nodes import NodeEvent
from libs.contracts.budget import BudgetEvent, BudgetEventKind, BudgetStatusReply, BudgetStatusRequest
from libs.contracts.commands import CancelJob, RequeueJob
from libs.contracts.jobs import JobSpec
from libs.contracts.envelope import utcnow
from libs.contracts.telemetry import CheckpointReport, RunOutcome, RunStarted, StepReport
from libs.runtime import bus
from libs.runtime.gctune import BATCH_GEN0_THRESHOLD
from libs.runtime.service import Runtime
from services.queue.commands import Commands
from services.queue.runs import Runs
from services.queue.scheduler import Scheduler
from services.queue.settings import QueueSettings
from services.queue.store import SCHEMA

from tests.integration.helpers_queue import FakeExecutor, client, queue_service
from tests.support import builders
from tests.support.services import eventually

pytestmark = pytest.mark.integration


def spec(**kw) -> JobSpec:
    return builders.spec(workload={"kind": "finetune", "params": {"steps": 20}}, **kw)


async def test_a_job_runs_to_success_with_its_events_in_order(env):
    settings = env.settings(QueueSettings, schedule_interval_seconds=0.1)
    async with queue_service(settings), client(settings) as c:
        ex = await FakeExecutor(c, "ex-a").start()
        try:
            submit = builders.submit(spec(name="demo"))
            outcome = await c.command(submit)
            assert outcome.accepted and outcome.job_id == submit.job_id and outcome.by == "queue"
            job_id = submit.job_id

            run = await ex.take()
            assert run.job_id == job_id and run.epoch == 1 and run.attempt == 1 and run.spec.name == "demo"
            assert run.lease_seconds == settings.lease_seconds and run.world_size == 1
            job = await c.wait_state(job_id, "running")
            assert job["executor_id"] == "ex-a" and job["lease_epoch"] == 1 and job["attempt_number"] == 1

            reply = await ex.renew()
            assert reply.ok and reply.expires_at > job["lease_expires_at"]
            common = dict(job_id=job_id, epoch=1, executor_id="ex-a")
            await ex.report(RunStarted(**common, device="cpu"))
            await ex.report(StepReport(**common, step=10, total_steps=20, step_seconds=0.25))
            await ex.report(CheckpointReport(**common, step=10, path="/ck/step-10.pt", sha256="ab", bytes=5))
            await ex.finish(RunOutcome.SUCCEEDED, exit_code=0, last_step=20)

            job = await c.wait_state(job_id, "succeeded")
            assert job["last_step"] == 20 and job["total_steps"] == 20 and job["step_seconds"] == 0.25
            assert job["last_checkpoint"]["step"] == 10 and job["last_checkpoint"]["path"] == "/ck/step-10.pt"
            kinds = ["submitted", "leased", "started", "checkpointed", "succeeded"]
            rows = await c.event_rows(job_id)
            assert [r["event"] for r in rows] == kinds and [r["seq"] for r in rows] == [1, 2, 3, 4, 5]
            published = await c.published_events(job_id, len(kinds))
            assert [e["event"] for e in published] == kinds and [e["seq"] for e in published] == [1, 2, 3, 4, 5]
            assert published[0]["detail"]["owner"] == "ann" and published[0]["detail"]["spec"]["name"] == "demo"
            assert (await ex.renew(job_id, 1)).ok is False
        finally:
            await ex.stop()


async def test_lease_expiry_requeues_under_a_new_epoch_and_the_old_executor_is_fenced_off(env):
    settings = env.settings(QueueSettings, schedule_interval_seconds=0.1, scan_interval_seconds=0.2,
                            lease_seconds=4.0, stop_margin_seconds=1.0)
    async with queue_service(settings), client(settings) as c:
        zombie = await FakeExecutor(c, "ex-zombie").start()
        try:
            submit = builders.submit(spec())
            assert (await c.command(submit)).accepted
            run = await zombie.take()
            assert run.epoch == 1
            zombie.beating = False  # contact lost: no heartbeats, no renewals
            job = await c.wait_state(submit.job_id, "queued", timeout=8)
            assert job["attempts"]["transport_lost"] == 1 and job["attempts"]["training_error"] == 0
            assert [r["event"] for r in await c.event_rows(submit.job_id)][-2:] == ["lease_expired", "requeued"]

            heir = await FakeExecutor(c, "ex-heir").start()
            try:
                run2 = await heir.take()
                assert run2.epoch == 2 and run2.attempt == 2
                await c.wait_state(submit.job_id, "running")
                # The zombie comes back: its renewal is refused, its failure report changes nothing.
                reply = await zombie.renew(submit.job_id, 1)
                assert not reply.ok and "stale epoch" in reply.reason
                await zombie.finish(RunOutcome.FAILED, exit_code=1, error="late")
                await heir.report(StepReport(job_id=submit.job_id, epoch=2, executor_id="ex-heir", step=7))
                job = await eventually(lambda: _with_step(c, submit.job_id, 7))
                assert job["state"] == "running" and job["lease_epoch"] == 2 and job["executor_id"] == "ex-heir"
                assert job["attempts"]["training_error"] == 0 and job["error"] is None
                await heir.finish(RunOutcome.SUCCEEDED, exit_code=0)
                await c.wait_state(submit.job_id, "succeeded")
            finally:
                await heir.stop()
        finally:
            await zombie.stop()


async def _with_step(c, job_id: str, step: int):
    job = await c.job(job_id)
    return job if job["last_step"] == step else None


async def test_training_failures_spend_attempts_until_the_job_fails_with_the_last_error(env):
    settings = env.settings(QueueSettings, schedule_interval_seconds=0.1)
    async with queue_service(settings), client(settings) as c:
        ex = await FakeExecutor(c, "ex-f").start()
        try:
            submit = builders.submit(spec(max_attempts=2))
            assert (await c.command(submit)).accepted
            for n in (1, 2):
                run = await ex.take()
                assert run.epoch == n and run.attempt == n
                await ex.finish(RunOutcome.FAILED, exit_code=3, error=f"Traceback: boom {n}")
            job = await c.wait_state(submit.job_id, "failed")
            assert job["reason"] == "Traceback: boom 2" and job["attempts"]["training_error"] == 2
            events = [r["event"] for r in await c.event_rows(submit.job_id)]
            assert events == ["submitted", "leased", "attempt_failed", "requeued", "leased", "attempt_failed",
                              "failed"]
        finally:
            await ex.stop()


async def test_cancel_stops_a_running_job_at_once_and_is_refused_afterwards(env):
    settings = env.settings(QueueSettings, schedule_interval_seconds=0.1)
    async with queue_service(settings), client(settings) as c:
        ex = await FakeExecutor(c, "ex-c").start()
        try:
            submit = builders.submit(spec())
            assert (await c.command(submit)).accepted
            await ex.take()
            outcome = await c.command(CancelJob(actor="op", job_id=submit.job_id, reason="wrong data"))
            assert outcome.accepted
            job = await c.job(submit.job_id)  # read-your-writes: committed before the outcome was published
            assert job["state"] == "cancelled" and job["reason"] == "wrong data"
            stop = await ex.next_directive()
            assert stop.job_id == submit.job_id and stop.epoch == 1 and stop.reason == "cancelled"
            reply = await ex.renew()
            assert not reply.ok and reply.reason == "job cancelled"

            again = await c.command(CancelJob(actor="op", job_id=submit.job_id))
            assert not again.accepted and again.reason == "job already cancelled"
            unknown = await c.command(CancelJob(actor="op", job_id="nope"))
            assert not unknown.accepted and unknown.reason == "no such job"
        finally:
            await ex.stop()


async def test_a_redelivered_command_acts_once_and_is_answered_again(env):
    settings = env.settings(QueueSettings)
    async with queue_service(settings), client(settings) as c:
        submit = builders.submit(spec())
        sub = await c.nc.subscribe(c.s.outcome_of(submit.command_id))
        # Two deliveries of one command (as after a crash before the ack): distinct stream message ids.
        for n in range(2):
            await bus.publish(c.js, c.s.cmd("submit"), submit.encode(), msg_id=f"{submit.id}-{n}")
        first, second = [await sub.next_msg(timeout=10) for _ in range(2)]
        outcomes = [json.loads(m.data) for m in (first, second)]
        assert all(o["accepted"] and o["job_id"] == submit.job_id for o in outcomes)
        assert outcomes[0]["id"] != outcomes[1]["id"]
        assert [r["event"] for r in await c.event_rows(submit.job_id)] == ["submitted"]
        assert await c.db.fetchval("SELECT count(*) FROM queue.jobs") == 1


async def test_ceiling_stop_interrupts_and_requeue_needs_room_above_consumption(env):
    settings = env.settings(QueueSettings, schedule_interval_seconds=0.1, stop_grace_seconds=7)
    async with queue_service(settings), client(settings) as c:
        ex = await FakeExecutor(c, "ex-b").start()
        budget_calls = []

        async def budget(msg):
            req = BudgetStatusRequest.decode(msg.data)
            budget_calls.append(req.job_id)
            await msg.respond(BudgetStatusReply(job_id=req.job_id, known=True, ceiling_seconds=100,
                                                consumed_seconds=103).encode())

        try:
            submit = builders.submit(spec(gpu_ceiling_seconds=100))
            assert (await c.command(submit)).accepted
            refused = await c.command(RequeueJob(actor="op", job_id=submit.job_id, gpu_ceiling_seconds=500))
            assert not refused.accepted and refused.reason == "budget service unavailable"

            await ex.take()
            exhausted = BudgetEvent(job_id=submit.job_id, event=BudgetEventKind.EXHAUSTED, ceiling_seconds=100,
                                    consumed_seconds=101)
            await bus.publish(c.js, c.s.budget(submit.job_id, "exhausted"), exhausted)
            stop = await ex.next_directive()
            assert stop.reason == "gpu_ceiling" and stop.checkpoint_first and stop.grace_seconds == 7
            assert (await c.job(submit.job_id))["state"] == "running"  # until the executor has stopped
            await ex.finish(RunOutcome.STOPPED)
            job = await c.wait_state(submit.job_id, "interrupted")
            assert job["reason"] == "gpu_ceiling"

            await c.nc.subscribe(c.s.rpc_budget_status, queue="budget", cb=budget)
            low = await c.command(RequeueJob(actor="op", job_id=submit.job_id, gpu_ceiling_seconds=150))
            assert not low.accepted
            assert low.detail == {"consumed_seconds": 103, "minimum_seconds": 163, "given_seconds": 150}
            ok = await c.command(RequeueJob(actor="op", job_id=submit.job_id, gpu_ceiling_seconds=300))
            # The two requeues asked; placement, woken by the job queued again, may ask a third time already.
            assert ok.accepted and budget_calls[:2] == [submit.job_id, submit.job_id]
            job = await c.job(submit.job_id)
            assert job["spec"]["gpu_ceiling_seconds"] == 300
            assert [(h["ceiling_seconds"], h["actor"]) for h in job["ceiling_history"]] == [(100, "ann"), (300, "op")]
            run = await ex.take()  # back in the queue: placed again under the next epoch
            assert run.epoch == 2 and run.spec.gpu_ceiling_seconds == 300
            requeued = [r for r in await c.event_rows(submit.job_id) if r["event"] == "requeued"]
            assert json.loads(requeued[-1]["detail"])["gpu_ceiling_seconds"] == 300
        finally:
            await ex.stop()


async def test_a_malformed_command_is_refused_visibly_and_answered_when_its_id_is_readable(env):
    settings = env.settings(QueueSettings)
    async with queue_service(settings), client(settings) as c:
        rejected = await c.js.pull_subscribe(c.s.rejected("queue"), durable=None)
        sub = await c.nc.subscribe(c.s.outcome_of("cmd-bad-1"))
        await bus.publish(c.js, c.s.cmd("submit"), b'{"schema": "teto.cmd.submit/1", "command_id": "cmd-bad-1"}',
                          msg_id="m1")
        outcome = json.loads((await sub.next_msg(timeout=10)).data)
        assert not outcome["accepted"] and "malformed command" in outcome["reason"] and "spec" in outcome["reason"]
        (note,) = await rejected.fetch(1, timeout=5)
        assert b"spec" in note.data
        # The service is still serving: a good command right after is accepted.
        assert (await c.command(builders.submit(spec()))).accepted


async def test_two_replicas_placing_at_the_same_moment_never_place_twice(env):
    """Both schedulers run their pass at once (as two replicas that both think they lead would): every job and
    every executor is granted at most once, under epoch 1. Each pass takes two jobs, so row locks alone would
    let them pick different jobs and the same executors; the placement lock makes the second wait and see."""
    settings = env.settings(QueueSettings, max_jobs_per_pass=2)
    replicas = [await Runtime.open("queue", settings, schema=SCHEMA, package="services.queue") for _ in range(2)]
    try:
        commands, runs = Commands(replicas[0], settings), Runs(replicas[0], settings)
        for i in range(5):
            assert (await commands.submit(builders.submit(spec(), job_id=f"job-{i}"))).accepted
        beats = [builders.heartbeat(f"ex-{i}", node_id=f"n{i}", sent_at=utcnow(), interval_seconds=1,
                                    progress_interval_seconds=1) for i in range(3)]
        await runs.heartbeats(beats)
        for i in range(3):  # their nodes passed their checks (the health service says so)
            await runs.node_event(NodeEvent(node_id=f"n{i}", seq=1, event="ready", state="ready",
                                            executor_id=f"ex-{i}", group="g", schedulable=True))
        placed = await asyncio.gather(*(Scheduler(r, settings).place_once() for r in replicas))
        assert sorted(placed) == [1, 2]
        rows = await replicas[0].pool.fetch("SELECT id, workers, lease_epoch FROM queue.jobs WHERE state = 'running'")
        assert len(rows) == 3 and {r["lease_epoch"] for r in rows} == {1}
        assert sorted(w for r in rows for w in r["workers"]) == ["ex-0", "ex-1", "ex-2"]
        assert [r["id"] for r in sorted(rows, key=lambda r: r["id"])] == ["job-0", "job-1", "job-2"]  # FIFO
        runs_sent = await replicas[0].pool.fetchval(
            "SELECT count(*) FROM queue.outbox WHERE subject LIKE $1", f"{settings.subject_prefix}.agent.%.run")
        assert runs_sent == 3
        assert await Scheduler(replicas[1], settings).place_once() == 0  # nothing free is left
    finally:
        for r in replicas:
            await r.close()


async def test_the_collector_is_tuned_once_the_service_is_ready(env):
    """Start-up objects frozen and a larger youngest generation (libs/runtime/gctune.py): a placement pass then
    walks no start-up object in a collection (docs/performance.md, placement's sixth round)."""
    before = gc.get_threshold()
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    try:
        async with queue_service(env.settings(QueueSettings)):
            assert gc.get_threshold()[0] == BATCH_GEN0_THRESHOLD and gc.get_freeze_count() > 0
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
