"""A frozen agent (SIGSTOP: a deadlock, a swap storm) on the real stack (issue 26 item 2, DESIGN.md section 12).

Its lease goes, the job runs elsewhere; but the agent is alive, so no parent-death signal ends its training
process, and it reads no report, so every checkpoint its run writes from then on is never reported. Required: the
run guard ends that process by itself before the queue can redeliver the job, the next run resumes from the last
checkpoint the QUEUE ACCEPTED (not from the newest file, which is the frozen run's), and the files the queue never
accepted are skipped (and deleted) visibly. Timings as tests/integration/test_faults.py: lease 6 s, heartbeat 1 s,
stop margin 1.5 s.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.support.fleet import at, death_of, fleet
from tests.support.services import eventually

pytestmark = pytest.mark.integration


def _events(events: list[dict], kind: str, epoch: int | None = None) -> list[dict]:
    return [e for e in events if e["event"] == kind and (epoch is None or e["epoch"] == epoch)]


async def test_a_frozen_agents_run_is_fenced_by_its_guard_and_the_job_resumes_from_the_last_accepted_checkpoint(
        env, tmp_path):
    async with fleet(env, tmp_path / "fleet") as f:
        frozen = f.start_executor("frozen")
        await f.wait_executors("frozen")
        # The default retention (3 kept): the frozen run writes more than 3 checkpoints its agent never reports, and
        # must not delete the accepted one for all that (its retention stops at the last report the bus took).
        job_id = await f.submit(f.spec("frozen", steps=600, step_seconds=0.05, every=10))
        await f.wait_job(job_id, lambda j: j["state"] == "running" and j["executor_id"] == "frozen", 30,
                         "running on the executor to be frozen")
        f.start_executor("spare")
        await f.wait_executors("spare")
        await f.wait_job(job_id, lambda j: (j.get("last_checkpoint") or {}).get("step"), 30, "an accepted checkpoint")
        (first,) = f.started(job_id)
        try:
            frozen_at = time.time()
            frozen.send_signal(signal.SIGSTOP)  # alive: no parent-death signal; frozen: no renewal, no report read
            died_at = await death_of(first["pid"], timeout=30)
            # The run is gone while epoch 1 is still the job's lease: what the queue accepted is final now.
            job = await f.job(job_id)
            assert job["lease_epoch"] == 1, job
            accepted = job["last_checkpoint"]
            assert accepted["epoch"] == 1  # recorded with the epoch of the lease holder that reported it
            written = {r["step"] for r in f.runs(job_id) if r["epoch"] == 1 and r["event"] == "checkpoint"}
            never_accepted = {s for s in written if s > accepted["step"]}
            assert len(never_accepted) > 3, (accepted, written)  # the frozen run wrote checkpoints nobody accepted

            done = await f.wait_done(job_id, timeout=120)
            assert done["state"] == "succeeded" and done["executor_id"] == "spare", done
            events = await f.events(job_id)
            (expired,) = _events(events, "lease_expired", epoch=1)
            # Ended by its guard before the queue could give the job to another (a lease after the last renewal).
            assert died_at < at(expired["time"]) <= at(_events(events, "leased", epoch=2)[0]["time"])
            assert all(r["t"] <= died_at for r in f.runs(job_id) if r["epoch"] == 1)
            print(f"\n[measured] SIGSTOP -> training process ended by its guard: {died_at - frozen_at:.2f}s; "
                  f"-> lease expired: {at(expired['time']) - frozen_at:.2f}s; checkpoints never accepted: "
                  f"{sorted(never_accepted)} (accepted: step {accepted['step']})")
            assert not [r for r in f.runs(job_id) if r["event"] == "overlap"]  # never two runs at once
            # Resumed from the checkpoint the queue accepted, not from the frozen run's newer files...
            _, second = f.started(job_id)
            assert second["epoch"] == 2 and second["resumed_from"] == accepted["step"], (
                second, accepted, _events(events, "checkpoint_skipped", epoch=2),
                [line for line in f.log_of("spare").splitlines() if "checkpoint" in line or "resum" in line])
            started = [e for e in _events(events, "started", epoch=2)]
            assert started[0]["detail"]["resumed_from_step"] == accepted["step"]
            # ... which were skipped visibly, each with why, and not trusted.
            skipped = _events(events, "checkpoint_skipped", epoch=2)
            steps = {int(e["detail"]["path"].rsplit("step-", 1)[1].split(".")[0]) for e in skipped}
            assert never_accepted <= steps, (never_accepted, skipped)
            assert all("never accepted" in e["reason"] for e in skipped), skipped
            assert done["attempts"]["transport_lost"] == 1 and done["attempts"]["training_error"] == 0
            # Thawed, the agent finds its run ended by the guard past the lease's deadline: abandoned, never a
            # training failure (its report is stale by now, and ignored, but it must not say "failed").
            frozen.send_signal(signal.SIGCONT)
            line = f"job {job_id} epoch 1 finished: "
            ended = await eventually(lambda: [x for x in f.log_of("frozen").splitlines() if line in x], 30,
                                     "the thawed agent's report of its run")
            assert f"{line}abandoned" in ended[0], ended
        finally:
            frozen.send_signal(signal.SIGCONT)
