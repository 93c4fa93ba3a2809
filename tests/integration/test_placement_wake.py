"""Placement reacts to events, not to its tick (issue 12, item 1): with a 30 s schedule interval, a submitted job
is granted to an idle executor at once, and a job waiting behind a busy executor is granted as soon as that
executor reports itself free, on real NATS and PostgreSQL (libs/runtime/wake.py, services/queue/domain/wakes.py)."""

from __future__ import annotations

import asyncio

import pytest

from libs.contracts.jobs import JobSpec
from libs.contracts.telemetry import RunOutcome
from services.queue.settings import QueueSettings

from tests.integration.helpers_queue import FakeExecutor, client, queue_service
from tests.support import builders

pytestmark = pytest.mark.integration
TICK = 30.0  # placement's timer; every grant below must come from a wake, well before it


def spec() -> JobSpec:
    return builders.spec(workload={"kind": "finetune", "params": {"steps": 20}})


async def test_a_submit_and_a_freed_executor_each_start_a_placement_pass_at_once(env):
    settings = env.settings(QueueSettings, schedule_interval_seconds=TICK)
    async with queue_service(settings), client(settings) as c:
        ex = await FakeExecutor(c, "ex-wake").start()
        try:
            await asyncio.sleep(1.0)  # the executor is known and idle; the loop's first pass is long over
            loop = asyncio.get_running_loop()
            first, second = builders.submit(spec()), builders.submit(spec())
            t0 = loop.time()
            assert (await c.command(first)).accepted
            run = await ex.take(timeout=TICK / 3)
            assert run.job_id == first.job_id
            assert (await c.command(second)).accepted  # waits: the only executor is busy
            await asyncio.sleep(1.0)
            assert ex.directives.empty()
            await ex.finish(RunOutcome.SUCCEEDED, exit_code=0, last_step=20)  # its next heartbeat is idle
            run = await ex.take(timeout=TICK / 3)
            assert run.job_id == second.job_id
            assert loop.time() - t0 < TICK  # both grants came before the first tick could have placed either
        finally:
            await ex.stop()
