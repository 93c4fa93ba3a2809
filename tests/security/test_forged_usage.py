"""Usage is charged only as far as a lease grant allows (the budget's side of issue 26, item 4).

With the real queue and budget services (real NATS and PostgreSQL): an executor publishes, under its own id,
the usage record of the issue (4096 devices x 30 days, 10.6e9 GPU-seconds) against a queued job it was never
granted (held, uncharged, until the grant names another executor, then refused), then against a job another
executor runs, then the holder itself claims more devices and more time than its grant allows. Each is refused
visibly on ``teto.rejected.budget`` and none is charged; the holder's honest record is charged.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

from libs.contracts.commands import SubmitJob
from libs.contracts.envelope import RejectedMessage
from libs.contracts.jobs import JobSpec
from libs.contracts.telemetry import RunOutcome
from libs.contracts.usage import UsageRecord, UsageReport
from libs.runtime import bus
from services.budget.app import serve as budget_serve
from services.budget.settings import BudgetSettings
from services.queue.settings import QueueSettings
from tests.integration.helpers_queue import FakeExecutor, client, queue_service
from tests.support.services import eventually


@asynccontextmanager
async def budget_service(settings: BudgetSettings):
    ready = asyncio.Event()
    task = asyncio.create_task(budget_serve(settings, ready=ready))
    try:
        await asyncio.wait_for(ready.wait(), 30)
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def usage(executor: str, job_id: str, epoch: int, seq: int, devices: int, wall: float) -> UsageReport:
    return UsageReport(executor_id=executor, node_id=f"node-{executor}", records=[
        UsageRecord(job_id=job_id, epoch=epoch, seq=seq, devices=devices, wall_seconds=wall)])


async def test_usage_outside_a_grant_is_refused_on_teto_rejected_budget_and_never_charged(env):
    settings = env.settings(QueueSettings, schedule_interval_seconds=0.1)
    async with queue_service(settings), budget_service(env.settings(BudgetSettings)), client(settings) as c:
        rejected = await c.nc.subscribe(c.s.rejected("budget"))
        ex = await FakeExecutor(c, "ex-a").start()
        try:
            spec = {"workload": {"kind": "finetune", "params": {"steps": 20}}, "gpu_ceiling_seconds": 3600}
            submit = SubmitJob(actor="ann", spec=JobSpec.model_validate(spec))
            assert (await c.command(submit)).accepted
            run = await ex.take()
            await c.wait_state(run.job_id, "running")
            # A second job stays queued: the only executor is busy. Nobody was ever granted it.
            queued = SubmitJob(actor="bob", spec=JobSpec.model_validate(spec))
            assert (await c.command(queued)).accepted

            async def consumed(job_id: str) -> float | None:
                return await c.db.fetchval("SELECT consumed_seconds FROM budget.jobs WHERE job_id = $1", job_id)

            async def next_rejection() -> RejectedMessage:
                return RejectedMessage.decode((await rejected.next_msg(timeout=15)).data)

            # 1. The record: ex-b, under its own id, against the queued job it was never granted. The
            # budget cannot know yet whether epoch 1 is granted (job events and usage are read apart): it holds it.
            await bus.publish(c.js, c.s.usage("ex-b"), usage("ex-b", queued.job_id, 1, 1, 4096, 2_592_000.0))
            assert await eventually(lambda: c.db.fetchval(
                "SELECT count(*) = 1 FROM budget.held_usage WHERE job_id = $1", queued.job_id), 15)
            # 2. Against the running job, whose epoch is public: ex-b does not hold it.
            await bus.publish(c.js, c.s.usage("ex-b"), usage("ex-b", run.job_id, run.epoch, 1, 1, 1.0))
            note = await next_rejection()
            assert note.subject == c.s.usage("ex-b") and run.job_id in note.payload_excerpt
            assert f"executor ex-b does not hold epoch {run.epoch} of job {run.job_id}" in note.reason
            # 3. The holder itself, beyond its grant: more devices than granted, more time than since the grant.
            await bus.publish(c.js, c.s.usage("ex-a"), usage("ex-a", run.job_id, run.epoch, 1, 4096, 1.0))
            assert "4096 devices claimed, 1 granted" in (await next_rejection()).reason
            await bus.publish(c.js, c.s.usage("ex-a"), usage("ex-a", run.job_id, run.epoch, 2, 1, 2_592_000.0))
            assert "since the grant" in (await next_rejection()).reason
            # The holder's honest record is charged; nothing of the rest ever was.
            await bus.publish(c.js, c.s.usage("ex-a"), usage("ex-a", run.job_id, run.epoch, 3, 1, 0.5))
            assert await eventually(lambda: _is(consumed(run.job_id), 0.5), 15)
            assert await consumed(queued.job_id) == 0.0

            # 4. The queued job is granted, to ex-a: the held record is judged again and refused, visibly.
            await ex.finish(RunOutcome.SUCCEEDED, exit_code=0, last_step=20)
            second = await ex.take()
            assert second.job_id == queued.job_id and second.epoch == 1
            note = await next_rejection()
            assert f"executor ex-b does not hold epoch 1 of job {queued.job_id}" in note.reason
            assert "4096" in note.payload_excerpt
            assert await c.db.fetchval("SELECT count(*) FROM budget.held_usage") == 0
            assert await consumed(queued.job_id) == 0.0
            rows = await c.db.fetch("SELECT executor_id, seq FROM budget.ledger ORDER BY id")
            assert [tuple(r) for r in rows] == [("ex-a", 3)]
        finally:
            await ex.stop()


async def _is(value, expected: float) -> bool:
    return await value == expected
