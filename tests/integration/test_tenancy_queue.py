"""Tenancy on the real queue (NATS and PostgreSQL), the test playing four executors: two organisations in one
cohort; one borrows the idle share of the other, the other then submits and gets its share back by preemption
(checkpoint first), the preempted job is queued again with no attempt spent and resumes from its checkpoint; every
queued job shows why it waits."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from libs.contracts.agents import StopJob
from libs.contracts.commands import SetCohort, SetOrganisation, SetProject
from libs.contracts.jobs import JobSpec
from libs.contracts.telemetry import CheckpointReport, RunOutcome, RunStarted
from libs.contracts.tenancy import CohortSpec, OrgSpec, QuotaSpec
from services.queue.settings import QueueSettings

from tests.integration.helpers_queue import FakeExecutor, client, queue_service
from tests.support import builders
from tests.support.services import eventually

pytestmark = pytest.mark.integration


def spec(**kw) -> JobSpec:
    return builders.spec(workload={"kind": "finetune", "params": {"steps": 100}}, **kw)


def org(nominal: int) -> OrgSpec:
    return OrgSpec(cohort="hospitals", quotas={"default": QuotaSpec(nominal=nominal)})


async def test_an_organisation_gets_its_share_back_from_a_borrower_by_preemption(env):
    settings = env.settings(QueueSettings, schedule_interval_seconds=0.1)
    async with queue_service(settings), client(settings) as c:
        executors = [await FakeExecutor(c, f"ex-{i}").start() for i in range(4)]
        renewing = asyncio.create_task(_renew(executors))
        try:
            for cmd in (SetCohort(actor="admin", name="hospitals", spec=CohortSpec(preemption="reclaim_borrowed")),
                        SetOrganisation(actor="admin", name="north", spec=org(2)),
                        SetOrganisation(actor="admin", name="south", spec=org(2)),
                        SetProject(actor="admin", org="south", name="radiology")):
                assert (await c.command(cmd)).accepted, cmd
            refused = await c.command(builders.submit(spec(project="nope"), actor="bob", org="south"))
            assert not refused.accepted and "project nope does not exist" in refused.reason

            # 1. south borrows north's idle share: its four jobs run on the four executors.
            south = [builders.submit(spec(name=f"s{i}", project="radiology"), actor="bob", org="south")
                     for i in range(4)]
            for cmd in south:
                assert (await c.command(cmd)).accepted
            runs = {}
            for ex in executors:
                run = await ex.take()
                runs[run.job_id] = ex
                await ex.report(RunStarted(job_id=run.job_id, epoch=run.epoch, executor_id=ex.id, device="cpu"))
            assert set(runs) == {cmd.job_id for cmd in south}
            for job_id in runs:
                job = await c.wait_state(job_id, "running")
                assert job["org"] == "south" and job["project"] == "radiology" and job["devices"] == 1

            # 2. north submits: nothing is free, and north is under its nominal share: a borrowed job is preempted.
            ann = builders.submit(spec(name="n0"), org="north")
            assert (await c.command(ann)).accepted
            stops = {}
            for job_id, ex in runs.items():
                try:
                    stops[job_id] = (await ex.next_directive(timeout=1.0 if stops else 15.0), ex)
                except TimeoutError:
                    continue
            assert len(stops) == 1, stops
            (victim, (stop, ex)), = stops.items()
            assert isinstance(stop, StopJob) and stop.checkpoint_first and stop.reason == "preempted"
            north_job = await c.job(ann.job_id)
            assert north_job["state"] == "queued" and north_job["waiting"]["code"] == "reclaiming"
            events = [dict(r) for r in await c.event_rows(victim)]
            stop_event = next(e for e in events if e["event"] == "stop_requested")
            assert "reclaims its nominal share" in stop_event["reason"]

            # 3. The victim checkpoints, stops; it is queued again for free, and north's job takes the executor.
            await ex.report(CheckpointReport(job_id=victim, epoch=stop.epoch, executor_id=ex.id, step=40,
                                             path="/ck/step-40.pt", sha256="ab", bytes=5))
            await eventually(lambda: _checkpointed(c, victim), 10)
            await ex.finish(RunOutcome.STOPPED, last_step=43)
            job = await c.wait_state(victim, "queued")
            assert job["attempts"]["preempted"] == 1 and job["attempts"]["training_error"] == 0
            assert job["last_checkpoint"]["step"] == 40
            run = await ex.take()
            assert run.job_id == ann.job_id
            await c.wait_state(ann.job_id, "running")
            # South now holds its nominal 2 + the borrowed ones still running; its requeued job waits, saying why.
            async def reason():
                j = await c.job(victim)
                return j["waiting"] if j["waiting"] and j["waiting"]["code"] in ("quota", "behind") else None
            waiting = await eventually(reason, 10)
            assert waiting["reason"]

            # 4. A borrowed job ends: the preempted one resumes (a new epoch, from its checkpoint's step).
            other = next(j for j in runs if j != victim)
            await runs[other].finish(RunOutcome.SUCCEEDED, exit_code=0, last_step=100)
            resumed = await runs[other].take()
            assert resumed.job_id == victim and resumed.epoch == 2 and resumed.attempt == 2
            job = await c.wait_state(victim, "running")
            assert job["attempts"]["training_error"] == 0 and job["last_checkpoint"]["step"] == 40
        finally:
            renewing.cancel()
            for ex in executors:
                await ex.stop()


async def _renew(executors) -> None:
    """The agents keep their leases (the test's executors run until told otherwise)."""
    while True:
        for ex in executors:
            if ex.job_id is not None:
                with contextlib.suppress(Exception):  # a lease just lost is refused: that is the test's business
                    await ex.renew()
        await asyncio.sleep(0.2)


async def _checkpointed(c, job_id: str) -> bool:
    job = await c.job(job_id)
    return bool(job and job["last_checkpoint"])


async def test_an_organisation_budget_reserves_remaining_ceilings_and_releases_the_unused_part(env):
    """Budget 100 GPU-seconds, ceilings 60: one job runs (60 reserved), the second waits with the numbers; the
    first ends having used 30 (charged by the real budget service): 70 left, the second runs."""
    from libs.contracts.usage import UsageRecord, UsageReport
    from libs.runtime import bus
    from services.budget.app import serve as serve_budget
    from services.budget.settings import BudgetSettings
    from tests.support.services import running

    settings = env.settings(QueueSettings, schedule_interval_seconds=0.1)
    async with running(serve_budget, env.settings(BudgetSettings)), queue_service(settings), client(settings) as c:
        ex = await FakeExecutor(c, "ex-0").start()
        other = await FakeExecutor(c, "ex-1").start()
        renewing = asyncio.create_task(_renew([ex, other]))
        try:
            spec_ = OrgSpec(budget_gpu_seconds=100.0)
            assert (await c.command(SetOrganisation(actor="admin", name="lab", spec=spec_))).accepted
            first, second = (builders.submit(spec(name=n, gpu_ceiling_seconds=60), org="lab")
                             for n in ("first", "second"))
            assert (await c.command(first)).accepted
            taker = await _first_run([ex, other])
            run = taker.run
            assert run.job_id == first.job_id
            assert (await c.command(second)).accepted

            async def budget_wait():
                j = await c.job(second.job_id)
                return j["waiting"] if j["waiting"] and j["waiting"]["code"] == "budget" else None
            wait = await eventually(budget_wait, 15)
            assert wait["reason"] == "organisation budget: 40 GPU-s left, job needs 60 GPU-s"
            assert wait["numbers"]["reserved_gpu_seconds"] == 60

            record = UsageRecord(job_id=run.job_id, epoch=run.epoch, seq=1, devices=1, wall_seconds=30.0, last=True)
            await bus.publish(c.js, c.s.usage(taker.ex.id), UsageReport(executor_id=taker.ex.id,
                                                                      node_id=f"node-{taker.ex.id}",
                                                                      records=[record]))
            await taker.ex.finish(RunOutcome.SUCCEEDED, exit_code=0, last_step=100)
            await c.wait_state(first.job_id, "succeeded")
            await c.wait_state(second.job_id, "running", timeout=20)
        finally:
            renewing.cancel()
            await ex.stop()
            await other.stop()


class _Taken:
    def __init__(self, ex, run) -> None:  # noqa: ANN001
        self.ex, self.run = ex, run


async def _first_run(executors) -> _Taken:  # noqa: ANN001
    """Whichever executor gets the grant."""
    tasks = {asyncio.create_task(ex.take()): ex for ex in executors}
    done, pending = await asyncio.wait(tasks, timeout=15, return_when=asyncio.FIRST_COMPLETED)
    for t in pending:
        t.cancel()
    (task,) = done
    return _Taken(tasks[task], task.result())
