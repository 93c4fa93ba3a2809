"""A requeue's new ceiling is checked against its organisation's remaining budget at the command (real queue and
budget services on NATS and PostgreSQL, the test playing the executor): over what is left it is refused with
the organisation, what is left and what is asked; within it, accepted."""

from __future__ import annotations

import pytest

from libs.contracts.commands import RequeueJob, SetOrganisation, SubmitJob
from libs.contracts.jobs import JobSpec
from libs.contracts.telemetry import RunOutcome, RunStarted
from libs.contracts.tenancy import OrgSpec
from libs.contracts.usage import UsageRecord, UsageReport
from libs.runtime import bus
from services.budget.app import serve as serve_budget
from services.budget.settings import BudgetSettings
from services.gateway.domain.outcomes import status_for
from services.queue.settings import QueueSettings
from tests.integration.helpers_queue import FakeExecutor, client, queue_service
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration


async def test_a_requeue_over_the_organisations_remaining_budget_is_refused_with_the_numbers(env):
    settings = env.settings(QueueSettings, schedule_interval_seconds=0.1)
    # 80 s of running reported at once: room for it since the grant (the grant's time bound is tested in
    # tests/unit/test_usage_grants.py and tests/security/test_forged_usage.py).
    budget = env.settings(BudgetSettings, usage_clock_slack_seconds=3600)
    async with running(serve_budget, budget), queue_service(settings), client(settings) as c:
        ex = await FakeExecutor(c, "ex-0").start()
        try:
            assert (await c.command(SetOrganisation(actor="admin", name="lab",
                                                    spec=OrgSpec(budget_gpu_seconds=200.0)))).accepted
            job = SubmitJob(actor="ann", org="lab", spec=JobSpec(name="j", gpu_ceiling_seconds=100,
                                                                 workload={"kind": "finetune"}))
            assert (await c.command(job)).accepted
            run = await ex.take(timeout=15)
            await ex.report(RunStarted(job_id=run.job_id, epoch=run.epoch, executor_id=ex.id, device="cpu"))
            record = UsageRecord(job_id=run.job_id, epoch=run.epoch, seq=1, devices=1, wall_seconds=80.0, last=True)
            await bus.publish(c.js, c.s.usage(ex.id), UsageReport(executor_id=ex.id, node_id=f"node-{ex.id}",
                                                                 records=[record]))
            # Stopped by the executor's own clock at the ceiling (80 s charged: below it, so no stop directive races
            # the next grant to this executor).
            await ex.finish(RunOutcome.STOPPED, stop_reason="gpu_ceiling", last_step=10)
            await c.wait_state(job.job_id, "interrupted")

            async def charged() -> bool:
                return await c.db.fetchval("SELECT consumed_seconds FROM budget.jobs WHERE job_id = $1",
                                           job.job_id) == 80.0
            await eventually(charged, 15)

            # 80 of 200 consumed: 120 left. A ceiling of 300 asks for 220 more.
            refused = await c.command(RequeueJob(actor="admin", job_id=job.job_id, gpu_ceiling_seconds=300))
            assert not refused.accepted
            assert refused.reason == "organisation lab budget: 120 GPU-s left, the new ceiling needs 220 GPU-s"
            numbers = refused.detail
            assert (numbers["org"], numbers["remaining_gpu_seconds"], numbers["asked_gpu_seconds"]) == ("lab", 120, 220)
            assert numbers["given_seconds"] == 300 and numbers["consumed_gpu_seconds"] == 80
            assert status_for("requeue", False, refused.reason, numbers) == 422  # what the gateway answers
            assert await c.state(job.job_id) == "interrupted"

            # A ceiling of 190 asks for 110: it fits, and the job is queued (and runs) again.
            accepted = await c.command(RequeueJob(actor="admin", job_id=job.job_id, gpu_ceiling_seconds=190))
            assert accepted.accepted, accepted.reason
            again = await ex.take(timeout=15)
            assert again.job_id == job.job_id and again.epoch == run.epoch + 1
        finally:
            await ex.stop()

