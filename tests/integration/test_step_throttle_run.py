"""A real script that reports steps 1-10 within one progress interval and then hangs: its job and its executor
both show step 10 once the interval ends (before, the job kept step 1 for good while the executor said 10)."""

from __future__ import annotations

import pytest

from tests.support.fleet import fleet
from tests.support.services import eventually

pytestmark = pytest.mark.integration


async def test_the_steps_a_hung_script_reported_last_reach_its_job_and_its_executor(env, tmp_path):
    async with fleet(env, tmp_path / "fleet") as f:
        f.start_executor("hang")  # progress interval 0.5 s: steps 1-10 come within 0.1 s
        await f.wait_executors("hang")
        spec = f.spec("hangs-at-10", steps=100, step_seconds=0.01, every=1000, HANG_AT_STEP="10")
        job_id = await f.submit(spec)
        await eventually(lambda: any(r["event"] == "hang" for r in f.runs(job_id)), 40, "the script to hang")

        async def both_at_ten() -> tuple | None:
            job, entry = await f.job(job_id), (await f.executor_entries())["hang"]
            return (job, entry) if job["last_step"] == 10 and entry["step"] == 10 else None

        job, entry = await eventually(both_at_ten, 20, "step 10 on the job and on its executor")
        assert job["state"] == "running" and entry["job_id"] == job_id
