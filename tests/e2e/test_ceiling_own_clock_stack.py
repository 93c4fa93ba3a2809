"""Item 8 through the whole stack (``teto up``): with a long heartbeat (5 s, the usage-report interval) a job
with a small GPU ceiling stops within ~1 GPU-second of it plus the grace, not a heartbeat past it, because the
grant carries the remaining GPU-seconds and the executor stops by its own clock; and it does so while the budget
service is stopped (SIGSTOP: no exhaustion can be published). Once the budget service runs again it reconciles:
the job's consumption and ``overshoot_seconds`` are charged from the usage reports as before."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.services import eventually_blocking as eventually  # these tests are synchronous

from .stack import JOB_PYTHON, start_stack

pytestmark = pytest.mark.e2e

HEARTBEAT = 5.0
GRACE = 2.0  # TETO_STOP_GRACE_SECONDS
CEILING = 8.0  # GPU-seconds: one CPU-only worker counts as one device
SLACK = 0.5  # the process's own exit and the last usage record
TRAIN_SCRIPT = str(Path(__file__).resolve().parents[2] / "examples" / "train_script.py")


def _spec() -> dict[str, Any]:
    return {"name": "ceiling-own-clock", "gpu_ceiling_seconds": CEILING, "checkpoint_every_steps": 5,
            "workload": {"kind": "command", "command": [JOB_PYTHON, TRAIN_SCRIPT],
                         "env": {"STEPS": "100000", "STEP_SECONDS": "0.2"}}}


def test_the_ceiling_holds_to_the_second_with_a_long_heartbeat_and_the_budget_service_stopped(tmp_path: Path):
    data_dir = tmp_path / "teto"
    stack = start_stack(data_dir, executors=1, lease=15, heartbeat=HEARTBEAT,
                        extra_env={"TETO_STOP_GRACE_SECONDS": str(GRACE)})
    (budget,) = [p for p in stack.processes() if p["name"] == "budget"]
    paused = False
    try:
        r = stack.post("/v1/jobs", _spec())
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        stack.wait_state(job_id, {"running"}, 60)
        os.kill(budget["pid"], signal.SIGSTOP)  # from here on no exhaustion can come from the budget
        paused = True
        job = stack.wait_state(job_id, {"interrupted", "failed", "succeeded"}, 60)
        assert job["state"] == "interrupted" and job["reason"] == "gpu_ceiling", (job, stack.log_tail())
        events = [e["event"] for e in stack.events(job_id)]
        assert "stop_requested" not in events  # the executor's own clock, not the budget's exhaustion
        os.kill(budget["pid"], signal.SIGCONT)
        paused = False

        def settled() -> dict | None:
            before = (stack.job(job_id)["budget"] or {}).get("overshoot_seconds")
            time.sleep(2 * HEARTBEAT)
            b = stack.job(job_id)["budget"] or {}
            return b if b.get("overshoot_seconds") is not None and b["overshoot_seconds"] == before else None

        b = eventually(settled, 90, "the budget to charge the stopped run's usage")
        assert b["consumed_seconds"] >= CEILING and b["remaining_seconds"] == 0, b
        # A bound from the settings, independent of (and under) the heartbeat, where before it was up to one
        # usage-report interval plus the grace.
        assert b["overshoot_seconds"] <= 1.0 + GRACE + SLACK, b
        assert b["overshoot_seconds"] < HEARTBEAT, b
        print(f"\nmeasured overshoot with heartbeat {HEARTBEAT:g}s: {b['overshoot_seconds']:.2f} GPU-s")
    finally:
        if paused:
            os.kill(budget["pid"], signal.SIGCONT)
        assert stack.stop() == 0
