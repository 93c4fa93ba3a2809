"""One organisation's bad data never stops the others' placement (issue 26, item 4), on the real gateway and queue
(NATS and PostgreSQL): ``PUT /v1/orgs/X {"weight": 5e-324}`` is a 422 naming the field; an organisation stored
with that weight before the bound (written here by hand, as an older release accepted it) is set aside: its job
waits saying why, while another organisation's job is placed; and a placement loop that keeps raising is a
problem in ``GET /v1/status`` until it works again."""

from __future__ import annotations

import pytest

from libs.contracts.jobs import JobSpec
from services.queue.settings import QueueSettings
from tests.integration.helpers_queue import FakeExecutor, client, queue_service
from tests.integration.test_gateway import gateway
from tests.support import builders
from tests.support.services import eventually

pytestmark = pytest.mark.integration


def spec() -> JobSpec:
    return builders.spec(workload={"kind": "finetune", "params": {"steps": 10}})


async def test_a_tiny_weight_is_refused_and_stored_bad_data_stops_only_its_own_organisation(env):
    settings = env.settings(QueueSettings, schedule_interval_seconds=0.1)
    async with queue_service(settings), client(settings) as c, gateway(env, stand_in=False, timeout=10.0) as gw:
        admin = gw.as_("admin")
        resp = await gw.client.put("/v1/orgs/tiny", json={"weight": 5e-324}, headers=admin)
        assert resp.status_code == 422, resp.text
        assert "weight" in resp.json()["reason"]
        for name in ("tiny", "lab"):
            resp = await gw.client.put(f"/v1/orgs/{name}", json={"weight": 1}, headers=admin)
            assert resp.status_code in (200, 201), resp.text
        # As an older release accepted it: the weight that overflowed every placement pass.
        await c.db.execute("""UPDATE queue.orgs SET spec = jsonb_set(spec, '{weight}', '5e-324') WHERE name = 'tiny'""")

        ex = await FakeExecutor(c, "ex-a").start()
        try:
            tiny = builders.submit(spec(), org="tiny")
            assert (await c.command(tiny)).accepted
            lab = builders.submit(spec(), actor="bob", org="lab")
            assert (await c.command(lab)).accepted
            run = await ex.take(timeout=15)  # placed, whatever tiny's settings hold
            assert run.job_id == lab.job_id
            job = await eventually(lambda: _waiting(c, tiny.job_id, "organisation_invalid"), 15)
            assert "organisation tiny's settings are refused" in job["waiting"]["reason"]
            assert await c.state(tiny.job_id) == "queued"
        finally:
            await ex.stop()


async def test_a_placement_loop_that_keeps_raising_is_a_problem_in_the_status_until_it_works_again(env):
    settings = env.settings(QueueSettings, schedule_interval_seconds=0.1)
    async with queue_service(settings), client(settings) as c, gateway(env, stand_in=False) as gw:

        async def problems() -> list[str]:
            resp = await gw.client.get("/v1/status", headers=gw.as_("admin"))
            assert resp.status_code == 200, resp.text
            return [p for p in resp.json()["problems"] if "loop placement" in p]

        assert await problems() == []
        queued = builders.submit(spec())  # no executor yet: it waits for the next pass
        assert (await c.command(queued)).accepted
        # Every pass reads the organisations first: without their table, each one raises.
        await c.db.execute("ALTER TABLE queue.orgs RENAME TO orgs_away")
        ex = await FakeExecutor(c, "ex-a").start()  # a free executor: passes run, and fail
        try:
            try:
                (problem,) = await eventually(problems, 30)
                assert problem.startswith("queue: loop placement of replica") and "failing since" in problem
                assert "orgs" in problem
            finally:
                await c.db.execute("ALTER TABLE queue.orgs_away RENAME TO orgs")
            assert (await ex.take(timeout=15)).job_id == queued.job_id
            assert await eventually(lambda: _none(problems), 30)
        finally:
            await ex.stop()


async def _waiting(c, job_id: str, code: str):
    job = await c.job(job_id)
    return job if job and (job.get("waiting") or {}).get("code") == code else None


async def _none(problems) -> bool:
    return await problems() == []
