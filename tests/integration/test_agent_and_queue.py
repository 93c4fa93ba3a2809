"""The real queue and a real executor agent together, for what neither side proves alone: a grant that races the
node's health check is handed back unstarted and the job's attempts show a hand-back (free, counted apart),
never a transport loss that did not happen; a run that cannot start spends training attempts and the job
shows why, instead of cycling forever as a transport loss."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import uuid

import pytest

from agents.executor.main import serve as agent_serve
from agents.executor.settings import ExecutorSettings
from libs.contracts.commands import SubmitJob
from libs.contracts.jobs import CommandWorkload, JobSpec
from libs.contracts.nodes import CheckTest, RunChecks
from libs.runtime import bus
from services.queue.settings import QueueSettings

from tests.integration.helpers_executor import TRAIN_SCRIPT
from tests.integration.helpers_queue import client, queue_service
from tests.support.services import eventually

pytestmark = pytest.mark.integration

# Heartbeats far apart, placement passes close together: the queue still believes the agent accepting (its last
# heartbeat said so) for a while after the check has begun, which is the race.
TIMING = dict(heartbeat_seconds=2.0, lease_seconds=12.0, stop_margin_seconds=3.0)


async def test_a_grant_racing_the_nodes_check_shows_handed_back_never_transport_lost(env):
    qs = env.settings(QueueSettings, schedule_interval_seconds=0.1, scan_interval_seconds=0.2,
                      require_checked_nodes=False, **TIMING)
    executor_id = f"ex-{uuid.uuid4().hex[:6]}"
    es = env.settings(ExecutorSettings, executor_id=executor_id, progress_interval_seconds=0.5, torch_threads=1,
                      check_timeout_seconds=60, **TIMING)
    ready = asyncio.Event()
    async with queue_service(qs), client(qs) as c:
        agent = asyncio.create_task(agent_serve(es, ready=ready))
        try:
            await asyncio.wait_for(ready.wait(), 30)

            async def seen_accepting():
                return await c.db.fetchval("SELECT last_seen FROM queue.executors WHERE executor_id = $1 AND "
                                           "accepting", executor_id)

            first = await eventually(seen_accepting, 20)
            # Right after a fresh "accepting" heartbeat: the next one is two seconds away.
            await eventually(lambda: _newer(seen_accepting, first), 10)
            await bus.publish(c.js, qs.subjects.agent(executor_id, "check"),
                              RunChecks(run_id=uuid.uuid4().hex, node_id=es.node_id, executor_id=executor_id,
                                        tests=[CheckTest.MATMUL, CheckTest.MEMBW, CheckTest.MEMTEST]))
            submit = SubmitJob(actor="ann", spec=JobSpec(workload=CommandWorkload(
                command=[sys.executable, TRAIN_SCRIPT], env={"STEPS": "2"})))
            assert (await c.command(submit)).accepted
            job = await c.wait_state(submit.job_id, "succeeded", timeout=120)
        finally:
            agent.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await agent
    attempts = job["attempts"]
    assert attempts["handed_back"] >= 1, attempts
    assert attempts["transport_lost"] == 0 and attempts["training_error"] == 0, attempts
    rows = await _events(qs, submit.job_id)
    requeues = [r["reason"] for r in rows if r["event"] == "requeued"]
    assert requeues and set(requeues) == {"handed_back"}, requeues
    assert any(r["event"] == "abandoned" and "health checks" in (r["reason"] or "") for r in rows)


async def test_a_run_that_cannot_start_spends_attempts_and_the_job_shows_why(env):
    qs = env.settings(QueueSettings, schedule_interval_seconds=0.1, scan_interval_seconds=0.2,
                      require_checked_nodes=False)
    es = env.settings(ExecutorSettings, executor_id=f"ex-{uuid.uuid4().hex[:6]}", torch_threads=1)
    submit = SubmitJob(actor="ann", spec=JobSpec(max_attempts=2, workload=CommandWorkload(
        command=[sys.executable, TRAIN_SCRIPT], env={"STEPS": "2"})))
    # A file where the job's working directory must be made: the process cannot be started there.
    work = es.effective_work_dir / "jobs" / submit.job_id
    work.parent.mkdir(parents=True, exist_ok=True)
    work.write_text("not a directory")
    async with queue_service(qs), client(qs) as c:
        agent = asyncio.create_task(agent_serve(es))
        try:
            assert (await c.command(submit)).accepted
            job = await c.wait_state(submit.job_id, "failed", timeout=60)
        finally:
            agent.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await agent
    assert job["attempts"]["training_error"] == 2 and job["attempts"]["transport_lost"] == 0, job["attempts"]
    assert job["error"].startswith("cannot start") and "FileExistsError" in job["error"], job["error"]


async def _newer(read, than) -> bool:
    seen = await read()
    return seen is not None and seen > than


async def _events(settings: QueueSettings, job_id: str) -> list[dict]:
    async with client(settings) as c:
        return [dict(r) for r in await c.event_rows(job_id)]
