"""The job and its executor agree from the moment of the grant to the run's end: with a real queue placing a job
on a real executor whose heartbeats are far apart (10 s), `GET /v1/executors` names the job while the executor's
last heartbeat still says it is idle (before, it showed the executor idle for up to a heartbeat interval), and
once the executor reported the run's end it names none while the last heartbeat still says training (before,
the finished job showed as training on its executor and node for up to a heartbeat interval)."""

from __future__ import annotations

import pytest

from tests.support.fleet import fleet
from tests.support.services import eventually

pytestmark = pytest.mark.integration

SLOW = {"TETO_HEARTBEAT_SECONDS": "10", "TETO_LEASE_SECONDS": "60"}


async def test_the_executor_list_names_the_granted_job_before_the_executors_next_heartbeat(env, tmp_path):
    async with fleet(env, tmp_path / "fleet", queue_overrides={"heartbeat_seconds": 10.0, "lease_seconds": 60.0}) as f:
        f.start_executor("slow", **SLOW)

        async def registered() -> bool:
            return bool(await f.db.fetchval("SELECT accepting FROM queue.executors WHERE executor_id = 'slow'"))

        await eventually(registered, 60, "the slow executor's first heartbeat")
        job_id = await f.submit(f.spec("granted", steps=400, step_seconds=0.05, every=50))
        await f.wait_job(job_id, lambda j: j["executor_id"] == "slow" and j["state"] == "running", 40,
                         "the grant to the slow executor")
        seen_before_heartbeat = 0
        for _ in range(5):
            # The executor's own report, read before and after the API: if neither names the job, the API's
            # answer cannot have come from a heartbeat.
            reported = "SELECT job_id FROM health.executors WHERE executor_id = 'slow'"
            before = await f.db.fetchval(reported)
            entry = (await f.executor_entries())["slow"]
            after = await f.db.fetchval(reported)
            job = await f.job(job_id)
            assert entry["job_id"] == job_id == job["id"] and entry["epoch"] == job["lease_epoch"], entry
            if before != job_id and after != job_id:
                seen_before_heartbeat += 1
                assert entry["job_source"] == "grant" and entry["phase"] == "starting"
        assert seen_before_heartbeat > 0, "the heartbeat named the job before the first read: nothing was shown"


async def test_once_the_run_is_reported_ended_the_executor_and_its_node_name_no_job_before_the_next_heartbeat(
        env, tmp_path):
    async with fleet(env, tmp_path / "fleet", queue_overrides={"heartbeat_seconds": 10.0, "lease_seconds": 60.0}) as f:
        f.start_executor("slow", **SLOW)

        async def registered() -> bool:
            return bool(await f.db.fetchval("SELECT accepting FROM queue.executors WHERE executor_id = 'slow'"))

        await eventually(registered, 60, "the slow executor's first heartbeat")
        reported = "SELECT job_id FROM health.executors WHERE executor_id = 'slow'"
        # Long enough for a heartbeat during the run (10 s apart), so health's row names the job when it ends.
        job_id = await f.submit(f.spec("ends", steps=240, step_seconds=0.05, every=100))

        async def named() -> bool:
            return await f.db.fetchval(reported) == job_id

        await eventually(named, 60, "a heartbeat naming the running job")
        await f.wait_job(job_id, lambda j: j["state"] == "succeeded", 60, "the run's end")
        seen_while_heartbeat_names_it = 0
        for _ in range(5):
            before = await f.db.fetchval(reported)
            entry = (await f.executor_entries())["slow"]
            nodes = {n["executor_id"]: n for n in (await f.http.get("/v1/nodes")).json()}
            after = await f.db.fetchval(reported)
            if before == job_id and after == job_id:
                seen_while_heartbeat_names_it += 1
                assert (entry["job_id"], entry["phase"], entry["step"], entry["job_source"]) == (
                    None, "idle", None, "report"), entry
                assert nodes["slow"]["job_id"] is None, nodes["slow"]
        assert seen_while_heartbeat_names_it > 0, "the next heartbeat came before the first read: nothing was shown"
