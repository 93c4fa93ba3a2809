"""The whole stack under least privilege: ``teto up`` (embedded NATS with the generated authorization) runs a
job to success with every part on its own NATS user, refuses a connection without credentials, and refuses an
executor's report that claims another executor, visibly (``teto.rejected.queue``, then the audit log).
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import nats
import pytest

from libs.contracts.envelope import RejectedMessage
from libs.contracts.subjects import Subjects
from libs.contracts.telemetry import RunFinished, RunOutcome
from libs.runtime import bus
from tests.e2e.stack import start_stack
from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

from .busprobe import Probe, publish_is_refused


async def _attack(nats_url: str, admin_creds: Path, executor_creds: Path, executor_id: str, job_id: str,
                  epoch: int) -> tuple[bool, RejectedMessage]:
    """As an executor: a "finished" report for a job under another executor's id (refused by the server), and
    one under its own subject claiming another executor (refused by the queue, with a rejection note)."""
    s = Subjects("teto")
    admin = await bus.connect(nats_url, "test-admin", credentials_file=admin_creds)
    client = await Probe.connect(nats_url, executor_creds)
    try:
        rejected = await admin.subscribe(s.rejected("queue"))
        forged = RunFinished(job_id=job_id, epoch=epoch, executor_id="someone-else", outcome=RunOutcome.FAILED,
                             error="forged")
        refused = await publish_is_refused(client, admin, s.progress(job_id, "someone-else"), s.heartbeat(executor_id),
                                           forged.encode())
        await client.nc.jetstream().publish(s.progress(job_id, executor_id), forged.encode())
        while True:  # the probe's sentinel (a bare heartbeat) is refused too, as malformed: not the one we want
            note = RejectedMessage.decode((await rejected.next_msg(timeout=30)).data)
            if note.subject == s.progress(job_id, executor_id):
                return refused, note
    finally:
        await client.close()
        await admin.close()


def test_a_job_succeeds_with_every_part_on_its_own_nats_user(stack_dir: Path):
    stack = start_stack(stack_dir, executors=1)
    try:
        info = json.loads((stack_dir / "stack.json").read_text())
        admin_creds = Path(info["nats_credentials_file"])
        r = stack.post("/v1/jobs", {"name": "least-privilege", "checkpoint_every_steps": 10,
                                    "workload": {"kind": "finetune", "params": {"steps": 30}}})
        assert r.status_code == 201, r.text
        done = stack.wait_state(r.json()["id"], {"succeeded", "failed"}, 180)
        assert done["state"] == "succeeded", (done, stack.log_tail())

        # The job's output went from the executor to the gateway, each on its own user.
        chunks = stack.get(f"/v1/jobs/{r.json()['id']}/logs").json()["chunks"]
        assert chunks and chunks[-1]["final"] and chunks[-1]["exit_code"] == 0, chunks[-3:]

        # Nothing any part did was refused by the bus (every subject it needs is in its permissions).
        logs = {f.name: f.read_text(errors="replace") for f in (stack_dir / "logs").glob("*.log")}
        assert not [name for name, text in logs.items() if "NATS refused" in text], stack.log_tail()

        # Each part has its own credentials file; the executor's user is its own id's.
        (executor,) = [p for p in stack.processes() if p["name"].startswith("executor")]
        executor_creds = stack_dir / "nats" / "creds" / f"executor-{executor['executor_id']}.json"
        assert json.loads(executor_creds.read_text())["user"] == f"executor-{executor['executor_id']}"
        assert executor_creds.stat().st_mode & 0o777 == 0o600

        # No credentials, no bus.
        logging.getLogger("nats.aio.client").disabled = True
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            asyncio.run(nats.connect(info["nats_url"], allow_reconnect=False, connect_timeout=5))

        # A forged run outcome for that job: refused by the server under another id, by the queue under its own.
        refused, note = asyncio.run(_attack(info["nats_url"], admin_creds, executor_creds, executor["executor_id"],
                                            done["id"], done.get("lease_epoch") or 1))
        assert refused
        assert "another executor" in note.reason and note.subject.endswith(executor["executor_id"])
        assert stack.job(done["id"])["state"] == "succeeded"
        eventually(lambda: any("another executor" in json.dumps(e)
                               for e in stack.get("/v1/audit?limit=1000").json()["entries"]), 30,
                   "the refusal in the audit log")
    finally:
        stack.stop()
