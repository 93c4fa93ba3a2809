"""A report is believed only from the executor that holds the run (the queue's side of attack 2).

The bus lets an executor publish only under its own id (tests/security/test_bus_authorization.py); here the
real queue service (real NATS and PostgreSQL) refuses, visibly on ``teto.rejected.queue``, what an executor
could still try under its own id: a body claiming another executor, a "failed" for a job it does not hold
(the epoch is public), and a renewal of another executor's lease. The job is untouched and finishes normally.
"""

from __future__ import annotations

from libs.contracts.commands import SubmitJob
from libs.contracts.envelope import RejectedMessage
from libs.contracts.jobs import JobSpec
from libs.contracts.leases import LeaseRenewReply, LeaseRenewRequest
from libs.contracts.telemetry import RunFinished, RunOutcome
from libs.runtime import bus
from services.queue.settings import QueueSettings
from tests.integration.helpers_queue import FakeExecutor, client, queue_service


async def test_the_queue_refuses_reports_and_renewals_from_an_executor_that_does_not_hold_the_run(env):
    settings = env.settings(QueueSettings, schedule_interval_seconds=0.1)
    async with queue_service(settings), client(settings) as c:
        rejected = await c.nc.subscribe(c.s.rejected("queue"))
        ex = await FakeExecutor(c, "ex-a").start()
        try:
            submit = SubmitJob(actor="ann", spec=JobSpec(workload={"kind": "finetune", "params": {"steps": 20}}))
            assert (await c.command(submit)).accepted
            run = await ex.take()
            await c.wait_state(run.job_id, "running")

            async def next_rejection() -> RejectedMessage:
                return RejectedMessage.decode((await rejected.next_msg(timeout=15)).data)

            # 1. Under its own subject, a body claiming the holder: refused at the edge.
            forged = RunFinished(job_id=run.job_id, epoch=run.epoch, executor_id="ex-a", outcome=RunOutcome.FAILED)
            await bus.publish(c.js, c.s.progress(run.job_id, "ex-b"), forged)
            note = await next_rejection()
            assert "another executor" in note.reason and note.subject == c.s.progress(run.job_id, "ex-b")

            # 2. Honest about itself, but it does not hold the run: refused by the queue.
            await bus.publish(c.js, c.s.progress(run.job_id, "ex-b"), RunFinished(
                job_id=run.job_id, epoch=run.epoch, executor_id="ex-b", outcome=RunOutcome.FAILED))
            note = await next_rejection()
            assert "does not hold" in note.reason

            # 3. A renewal of ex-a's lease sent as ex-b: refused, and answered so.
            req = LeaseRenewRequest(job_id=run.job_id, epoch=run.epoch, executor_id="ex-a")
            reply = LeaseRenewReply.decode((await c.nc.request(c.s.rpc_lease_renew_of("ex-b"), req.encode(),
                                                               timeout=5)).data)
            assert not reply.ok and "another executor" in (reply.reason or "")
            assert "another executor" in (await next_rejection()).reason

            # The job is where it was, and its real executor finishes it.
            assert await c.state(run.job_id) == "running"
            assert (await ex.renew()).ok
            await ex.finish(RunOutcome.SUCCEEDED, exit_code=0, last_step=20)
            await c.wait_state(run.job_id, "succeeded")
        finally:
            await ex.stop()
