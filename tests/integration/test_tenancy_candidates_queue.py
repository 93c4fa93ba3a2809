"""The real queue (NATS and PostgreSQL) with a placement pass that considers only 2 queued jobs: a big
organisation's many older queued jobs do not hide a small organisation's newer one from fair share (candidates
by share deficit, services/queue/tenancy/candidates.py), the test playing two executors."""

from __future__ import annotations

import asyncio

import pytest

from libs.contracts.commands import SetOrganisation, SubmitJob
from libs.contracts.jobs import JobSpec
from libs.contracts.tenancy import OrgSpec
from services.queue.settings import QueueSettings
from tests.integration.helpers_queue import FakeExecutor, client, queue_service
from tests.support.services import eventually
from tests.integration.test_tenancy_queue import _renew

pytestmark = pytest.mark.integration


def submit(org: str, name: str) -> SubmitJob:
    return SubmitJob(actor=f"{org}-user", org=org, spec=JobSpec(name=name, workload={"kind": "finetune"}))


async def test_a_small_organisations_job_beyond_the_first_n_is_placed_by_fair_share(env):
    settings = env.settings(QueueSettings, schedule_interval_seconds=0.1, max_jobs_per_pass=2)
    async with queue_service(settings), client(settings) as c:
        first = await FakeExecutor(c, "ex-0").start()
        executors = [first]
        renewing = asyncio.create_task(_renew(executors))
        try:
            for name in ("big", "small"):
                assert (await c.command(SetOrganisation(actor="admin", name=name, spec=OrgSpec()))).accepted
            b0 = submit("big", "b0")
            assert (await c.command(b0)).accepted
            assert (await first.take(timeout=15)).job_id == b0.job_id  # big now holds one device
            later = [submit("big", f"b{i}") for i in range(1, 5)] + [submit("small", "s0")]
            for cmd in later:  # the small organisation's job is the newest of five queued
                assert (await c.command(cmd)).accepted
            second = await FakeExecutor(c, "ex-1").start()
            executors.append(second)
            run = await second.take(timeout=15)
            # The oldest two (b1, b2) alone would have given big the node; by share deficit small is seen first.
            assert run.job_id == later[-1].job_id
            await c.wait_state(run.job_id, "running")
            assert {await c.state(cmd.job_id) for cmd in later[:-1]} == {"queued"}
        finally:
            renewing.cancel()
            for ex in executors:
                await ex.stop()


async def test_every_queued_job_says_why_it_waits_even_beyond_the_pass(env):
    """Issue 26: a pass considers max_jobs_per_pass queued jobs and only those had a reason (91 of 291 had none).
    With no executor at all, the two a pass considers wait for a node; every other one is behind the jobs before
    it in the candidates' order."""
    settings = env.settings(QueueSettings, schedule_interval_seconds=0.1, max_jobs_per_pass=2)
    async with queue_service(settings), client(settings) as c:
        assert (await c.command(SetOrganisation(actor="admin", name="big", spec=OrgSpec()))).accepted
        jobs = [submit("big", f"b{i}") for i in range(6)]
        for cmd in jobs:
            assert (await c.command(cmd)).accepted

        async def reasons():
            got = [((await c.job(cmd.job_id)) or {}).get("waiting") for cmd in jobs]
            return got if all(got) and sum(w["code"] == "behind" for w in got) == 4 else None

        waiting = await eventually(reasons, 15, "a reason on every queued job")
        assert [w["code"] for w in waiting[:2]] == ["no_ready_node"] * 2  # the two the pass considered
        assert [w["numbers"]["ahead"] for w in waiting[2:]] == [2, 3, 4, 5]  # oldest first: fair share in one org
        assert waiting[2]["reason"].startswith("behind 2 jobs")
