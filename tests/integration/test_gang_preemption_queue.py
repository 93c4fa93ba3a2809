"""A borrowing gang preempted the Teto way on the real queue (NATS and PostgreSQL), the test playing four
executors: south runs two gangs of 2 on four nodes (2 of them borrowed from north); north submits a job within its
nominal share; the newer gang is the victim: every worker is told to checkpoint and stop, and once all have ended
it is queued again with no attempt spent and its checkpoint kept, while north's job takes a freed node."""

from __future__ import annotations

import asyncio

import pytest

from libs.contracts.agents import StopJob
from libs.contracts.commands import SetCohort, SetOrganisation, SubmitJob
from libs.contracts.jobs import JobSpec
from libs.contracts.telemetry import CheckpointReport, RunOutcome, WorkerReady
from libs.contracts.tenancy import CohortSpec, OrgSpec, QuotaSpec
from services.queue.settings import QueueSettings
from tests.integration.helpers_queue import FakeExecutor, client, queue_service
from tests.integration.test_tenancy_queue import _first_run, _renew
from tests.support import builders
from tests.support.services import eventually

pytestmark = pytest.mark.integration


def gang(name: str) -> SubmitJob:
    return builders.submit(builders.spec(name=name, workers=2), actor="bob", org="south")


async def _form(c, executors, cmd: SubmitJob) -> list:  # noqa: ANN001
    """Submit a gang and play its two workers until it runs; the executors that took it."""
    assert (await c.command(cmd)).accepted
    idle = [ex for ex in executors if ex.job_id is None]
    taken = []
    for ex in idle:
        try:
            run = await ex.take(timeout=15 if not taken else 3)
        except TimeoutError:
            continue
        taken.append((ex, run))
    assert len(taken) == 2 and {run.job_id for _, run in taken} == {cmd.job_id}
    for ex, run in taken:
        await ex.report(WorkerReady(job_id=run.job_id, epoch=run.epoch, executor_id=ex.id, rank=run.rank,
                                    world_size=2))
    await c.wait_state(cmd.job_id, "running")
    return sorted(taken, key=lambda t: t[1].rank)


async def test_a_borrowing_gang_is_preempted_checkpoint_first_and_requeued_for_free(env):
    settings = env.settings(QueueSettings, schedule_interval_seconds=0.1)
    async with queue_service(settings), client(settings) as c:
        executors = [await FakeExecutor(c, f"ex-{i}").start() for i in range(4)]
        renewing = asyncio.create_task(_renew(executors))
        try:
            quota = {"default": QuotaSpec(nominal=2)}
            for cmd in (SetCohort(actor="admin", name="hospitals", spec=CohortSpec(preemption="reclaim_borrowed")),
                        SetOrganisation(actor="admin", name="north", spec=OrgSpec(cohort="hospitals", quotas=quota)),
                        SetOrganisation(actor="admin", name="south", spec=OrgSpec(cohort="hospitals", quotas=quota))):
                assert (await c.command(cmd)).accepted
            older, newer = gang("older"), gang("newer")
            first = await _form(c, executors, older)
            second = await _form(c, executors, newer)

            north = SubmitJob(actor="ann", org="north", spec=JobSpec(name="n0", workload={"kind": "finetune"}))
            assert (await c.command(north)).accepted
            stops = [await ex.next_directive(timeout=15) for ex, _ in second]
            assert all(isinstance(s, StopJob) and s.checkpoint_first and s.reason == "preempted" for s in stops)
            for ex, _ in first:  # the older gang keeps running
                with pytest.raises(TimeoutError):
                    await ex.next_directive(timeout=1.0)
            assert (await c.job(north.job_id))["waiting"]["code"] == "reclaiming"

            (rank0, run0), (rank1, _) = second
            await rank0.report(CheckpointReport(job_id=newer.job_id, epoch=run0.epoch, executor_id=rank0.id,
                                                step=40, path="/ck/step-40.pt", sha256="ab", bytes=5))

            async def checkpointed() -> bool:
                return bool((await c.job(newer.job_id))["last_checkpoint"])
            await eventually(checkpointed, 10)
            await rank1.finish(RunOutcome.STOPPED, last_step=43)
            await asyncio.sleep(0.5)
            assert await c.state(newer.job_id) == "running"  # waits for every worker (rank 0's checkpoint)
            await rank0.finish(RunOutcome.STOPPED, last_step=43)
            job = await c.wait_state(newer.job_id, "queued")
            assert job["attempts"]["preempted"] == 1 and job["attempts"]["training_error"] == 0
            assert job["last_checkpoint"]["step"] == 40
            got = await _first_run([rank0, rank1])  # at once: a grant left untaken would lose its lease
            assert got.run.job_id == north.job_id
            other = rank1 if got.ex is rank0 else rank0
            with pytest.raises(TimeoutError):  # the gang needs two nodes: one is free, and south is over its share
                await other.next_directive(timeout=1.0)
            await c.wait_state(north.job_id, "running")
        finally:
            renewing.cancel()
            for ex in executors:
                await ex.stop()
