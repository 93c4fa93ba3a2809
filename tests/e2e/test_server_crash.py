"""A killed nats-server or PostgreSQL under ``teto up`` is started again, and the stack carries on: the running
fine-tune is not stopped, succeeds, and every second it ran is charged (issue 26, item 1: one crash of either
server was a 42-minute outage, its running jobs killed and about 10.7 GPU-s each never charged)."""

from __future__ import annotations

import os
import signal
from datetime import datetime
from pathlib import Path

import pytest

from teto.stack.servers import postmaster_pid, process_alive
from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

from .stack import Stack, start_stack

pytestmark = pytest.mark.e2e


def _pid_of(stack: Stack, name: str) -> int:
    return next(p["pid"] for p in stack.processes() if p["name"] == name)


def _kill_postgres(data_dir: Path) -> int:
    pgdata = (data_dir / "postgres" / "pgdata").resolve()
    pid = postmaster_pid(pgdata)
    assert pid is not None and process_alive(pid)
    os.kill(pid, signal.SIGKILL)
    return pid


def _job(stack: Stack, job_id: str) -> dict:
    """The job, or {} while the gateway answers that the database is away (503: said, not an error)."""
    r = stack.get(f"/v1/jobs/{job_id}")
    assert r.status_code in (200, 503), r.text
    return r.json() if r.status_code == 200 else {}


def _time(event: dict) -> datetime:
    return datetime.fromisoformat(event["time"])


def test_killed_servers_come_back_and_the_running_job_goes_on_fully_charged(stack_dir: Path):
    # A lease of 20 s (the default is 180): each server is back in a few seconds, well inside it.
    stack = start_stack(stack_dir, lease=20, heartbeat=2)
    try:
        r = stack.post("/v1/jobs", {"name": "outage", "checkpoint_every_steps": 10, "workload": {
            "kind": "finetune", "params": {"steps": 120, "batch_size": 8, "seq_len": 32, "step_delay_seconds": 0.1}}})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        eventually(lambda: (stack.job(job_id).get("last_step") or 0) >= 10, 240, "the job training")

        nats_pid = _pid_of(stack, "nats")
        os.kill(nats_pid, signal.SIGKILL)
        eventually(lambda: _pid_of(stack, "nats") != nats_pid, 30, "nats-server started again")
        eventually(lambda: stack.get("/healthz").status_code == 200, 30, "the gateway answering")

        old_pg = _kill_postgres(stack_dir)
        eventually(lambda: (p := postmaster_pid((stack_dir / "postgres" / "pgdata").resolve())) not in (None, old_pg)
                   and process_alive(p), 60, "PostgreSQL started again")

        done = eventually(lambda: (j := _job(stack, job_id)).get("state") in
                          {"succeeded", "failed", "interrupted", "cancelled"} and j, 300, "the job to end")
        assert done["state"] == "succeeded", (done, stack.log_tail())
        # Neither outage stopped the run: one attempt, never requeued.
        events = stack.events(job_id)
        kinds = [e["event"] for e in events]
        assert kinds.count("started") == 1, [(e["event"], e["time"], e.get("reason")) for e in events]
        assert kinds.count("started") == 1 and "requeued" not in kinds and "lease_expired" not in kinds, kinds
        # Every second it ran was charged (usage is retried until the bus has it; nothing lost in the outage).
        started = _time(next(e for e in events if e["event"] == "started"))
        ended = _time(next(e for e in events if e["event"] == "succeeded"))
        wall = (ended - started).total_seconds()
        consumed = eventually(lambda: (b := stack.job(job_id)["budget"]) and b.get("consumed_seconds") and
                              b["consumed_seconds"] >= 0.9 * wall and b["consumed_seconds"], 60,
                              f"the run's {wall:.1f} s charged")
        assert consumed <= 1.1 * wall + 2, (consumed, wall)
    finally:
        assert stack.stop() == 0
