"""Issue 26, item 4, as it was found: under ``teto up`` (every part on its own NATS user), one executor publishes,
with its own credentials, a usage record against a queued job it was never granted (4096 devices x 30 days:
10,616,832,000 GPU-seconds). Before, the job went ``interrupted`` at its ceiling without ever running; now
nothing is charged, and once the job ends without that grant the record is refused on ``teto.rejected.budget``,
which the audit log shows."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from libs.contracts.subjects import Subjects
from libs.contracts.usage import UsageRecord, UsageReport
from libs.runtime import bus
from tests.e2e.stack import start_stack
from tests.support.services import eventually_blocking as eventually  # these tests are synchronous


async def _forge(nats_url: str, executor_creds: Path, executor_id: str, job_id: str) -> None:
    s = Subjects("teto")
    nc = await bus.connect(nats_url, "test-executor", credentials_file=executor_creds)
    try:
        report = UsageReport(executor_id=executor_id, node_id="forged", records=[UsageRecord(
            job_id=job_id, epoch=1, seq=1, devices=4096, wall_seconds=2_592_000.0)])
        await bus.publish(nc.jetstream(), s.usage(executor_id), report)  # acknowledged by JetStream: stored
    finally:
        await nc.close()


def test_an_executor_s_usage_for_a_job_it_was_never_granted_is_never_charged(stack_dir: Path):
    stack = start_stack(stack_dir, executors=1)
    try:
        info = json.loads((stack_dir / "stack.json").read_text())
        (executor,) = [p for p in stack.processes() if p["name"].startswith("executor")]
        creds = stack_dir / "nats" / "creds" / f"executor-{executor['executor_id']}.json"
        # Two workers on a one-executor fleet: it stays queued, granted to nobody.
        r = stack.post("/v1/jobs", {"name": "never-granted", "workers": 2, "gpu_ceiling_seconds": 3600,
                                    "workload": {"kind": "finetune", "params": {"steps": 10}}})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        asyncio.run(_forge(info["nats_url"], creds, executor["executor_id"], job_id))

        # The budget has read it (held: its epoch may be a grant still on its way) and charged nothing.
        def cancelled_uncharged() -> dict | None:
            job = stack.job(job_id)
            return job if job["state"] == "cancelled" else None

        r = stack.post(f"/v1/jobs/{job_id}/cancel", {"reason": "never granted"})
        assert r.status_code in (200, 202), r.text
        job = eventually(cancelled_uncharged, 60, "the job cancelled")
        # The job ended without that grant: the record is refused, visibly, and the audit log has it.
        entry = eventually(lambda: [e for e in stack.get("/v1/audit?limit=1000").json()["entries"]
                                    if "was never granted" in json.dumps(e) and job_id in json.dumps(e)], 60,
                           "the refused usage record in the audit log")
        assert entry
        job = stack.job(job_id)
        assert job["budget"]["consumed_seconds"] == 0, job["budget"]
        assert job["state"] == "cancelled"
    finally:
        stack.stop()
