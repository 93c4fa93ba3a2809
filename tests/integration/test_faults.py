"""Leases and signals under real faults: real NATS and PostgreSQL, the queue, health and gateway services, and
executor agents as subprocesses running a real training script (tests/support/fault_workload.py).

Timings (tests/conftest.py): lease 6 s, heartbeat 1 s, stop margin 1.5 s; the queue scans leases every 0.5 s.
So an executor cut off gives up 4.5 s after its last acknowledged renewal and the queue redelivers 6 s after
the last renewal it received: the training process must be dead in between.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.support.fleet import at, death_of, fleet, process_gone
from tests.support.proxy import TcpProxy
from tests.support.services import eventually

pytestmark = pytest.mark.integration


def _event(events: list[dict], kind: str, epoch: int | None = None) -> dict:
    found = [e for e in events if e["event"] == kind and (epoch is None or e["epoch"] == epoch)]
    assert found, f"no {kind} event (epoch {epoch}) in {[e['event'] for e in events]}"
    return found[0]


async def test_an_executor_cut_off_stops_training_before_redelivery_and_its_late_messages_are_ignored(env, tmp_path):
    async with fleet(env, tmp_path / "fleet") as f:
        proxy = TcpProxy.to_url(f.nats_url).start()
        try:
            f.start_executor("cut", nats_url=proxy.url)
            await f.wait_executors("cut")
            job_id = await f.submit(f.spec("cut-off", steps=200, step_seconds=0.05, every=10))
            await f.wait_job(job_id, lambda j: j["state"] == "running" and j["executor_id"] == "cut", 30,
                             "running on the executor behind the proxy")
            f.start_executor("spare")  # direct connection; free when the lease expires
            await f.wait_executors("spare")
            await eventually(lambda: any(r["event"] == "checkpoint" for r in f.runs(job_id)), 30, "a checkpoint")
            (first,) = f.started(job_id)

            # 1. Sever the executor's link to NATS: no renewal reaches the queue from now on.
            cut_at = time.time()
            assert proxy.cut() >= 1
            died_at = await death_of(first["pid"], timeout=15)
            job = await f.wait_job(job_id, lambda j: j["lease_epoch"] >= 2, 20, "redelivery under epoch 2")
            events = await f.events(job_id)
            expired_at = at(_event(events, "lease_expired", epoch=1)["time"])
            redelivered_at = at(_event(events, "leased", epoch=2)["time"])
            assert job["executor_id"] == "spare"
            # The process was stopped before the queue could redeliver, and wrote nothing after.
            assert died_at < expired_at <= redelivered_at
            assert all(r["t"] < died_at for r in f.runs(job_id) if r["epoch"] == 1)
            # It held on through lost renewals: not before lease - stop margin - one heartbeat after the cut.
            s = f.queue_settings
            assert died_at - cut_at > s.lease_seconds - s.effective_stop_margin - s.heartbeat_seconds - 0.5
            print(f"\n[measured] cut -> training process stopped: {died_at - cut_at:.2f}s; "
                  f"stopped -> lease expired: {expired_at - died_at:.2f}s; "
                  f"stopped -> redelivered: {redelivered_at - died_at:.2f}s "
                  f"(lease {s.lease_seconds:g}s, heartbeat {s.heartbeat_seconds:g}s, "
                  f"stop margin {s.effective_stop_margin:g}s, scan {s.scan_interval_seconds:g}s)")

            # 2. Heal the partition: the old executor's late reports (old epoch) reach the services and are ignored.
            proxy.restore()
            entry = await eventually(lambda: _stale_entry(f, "cut"), 30, "the zombie's stale reports counted")
            assert entry["stale_reports"] >= 1
            done = await f.wait_done(job_id, timeout=60)
            assert done["state"] == "succeeded" and done["executor_id"] == "spare", done
            assert done["attempts"]["transport_lost"] == 1 and done["attempts"]["training_error"] == 0
            assert done["lease_epoch"] == 2 and done["last_step"] == 200
            # It resumed from the last checkpoint the queue accepted from the first run, not from scratch, and not
            # from the newer ones that run wrote while cut off (never reported, so never accepted: DESIGN.md 12).
            first_run, second_run = f.started(job_id)
            accepted = [e["detail"]["step"] for e in await f.events(job_id)
                        if e["event"] == "checkpointed" and e["epoch"] == 1]
            assert first_run["resumed_from"] == 0 and second_run["resumed_from"] == accepted[-1], accepted
            # Nothing from epoch 1 moved the job after the redelivery: no 'abandoned', no second expiry.
            events = await f.events(job_id)
            after = events[events.index(_event(events, "leased", epoch=2)):]
            assert {e["epoch"] for e in after} <= {2, None}, after
            assert not [e for e in events if e["event"] == "abandoned"]
            assert not [r for r in f.runs(job_id) if r["event"] == "overlap"]
            # Back in contact, the old executor reports idle again.
            await f.wait_executors("cut")
        finally:
            proxy.close()


async def _entry(f, executor_id: str, check) -> dict | None:
    entry = (await f.executor_entries()).get(executor_id)
    return entry if entry and check(entry) else None


async def _stale_entry(f, executor_id: str) -> dict | None:
    return await _entry(f, executor_id, lambda e: e["stale_reports"])


SIGNAL_NUMBERS = ("seconds_since_heartbeat", "seconds_since_step_change", "no_signal_after_seconds",
                  "stuck_after_seconds")


def _signal(job: dict) -> str | None:
    return (job.get("signal") or {}).get("signal")


async def test_an_executor_killed_goes_no_signal_then_its_job_finishes_elsewhere_and_its_process_stops(env, tmp_path):
    async with fleet(env, tmp_path / "fleet") as f:
        victim = f.start_executor("victim")
        await f.wait_executors("victim")
        job_id = await f.submit(f.spec("killed", steps=150, step_seconds=0.05, every=10))
        await f.wait_job(job_id, lambda j: j["state"] == "running" and j["executor_id"] == "victim", 30,
                         "running on the victim")
        f.start_executor("spare")
        await f.wait_executors("spare")
        await eventually(lambda: any(r["event"] == "checkpoint" for r in f.runs(job_id)), 30, "a checkpoint")
        (first,) = f.started(job_id)

        # While it runs, the job and the executor list show the same signal, with the numbers behind it.
        job = await f.wait_job(job_id, lambda j: _signal(j) == "ok", 15, "signal ok")
        assert job["signal"]["signal_since"] and job["signal"]["executor_id"] == "victim"
        assert all(isinstance(job["signal"][k], int | float) for k in SIGNAL_NUMBERS), job["signal"]
        listed = {j["id"]: j for j in (await f.http.get("/v1/jobs")).json()}[job_id]
        assert _signal(listed) == "ok" and set(SIGNAL_NUMBERS) <= set(listed["signal"])
        entry = await eventually(lambda: _entry(f, "victim", lambda e: e["job_id"] == job_id), 10,
                                 "a heartbeat naming the job")
        assert (entry["signal"], entry["job_id"], entry["node_id"]) == ("ok", job_id, "node-victim")
        assert entry["last_heartbeat"] and entry["signal_since"] and entry["stale_reports"] == 0

        # SIGKILL the agent: nothing of it runs on, and its training process goes with it.
        victim.send_signal(signal.SIGKILL)
        killed_at = time.time()
        child_died = await death_of(first["pid"], timeout=5)
        job = await f.wait_job(job_id, lambda j: _signal(j) == "no_signal", 15, "no_signal")
        entry = (await f.executor_entries())["victim"]
        assert job["state"] == "running" and job["executor_id"] == "victim"
        assert entry["signal"] == "no_signal" and entry["job_id"] == job_id
        assert job["signal"]["seconds_since_heartbeat"] > job["signal"]["no_signal_after_seconds"]
        no_signal_after = at(job["signal"]["signal_since"]) - killed_at

        # At lease expiry the job goes back to the queue (free), then finishes on the spare from its checkpoint.
        done = await f.wait_done(job_id, timeout=60)
        assert done["state"] == "succeeded" and done["executor_id"] == "spare", done
        assert done["attempts"]["transport_lost"] == 1 and done["attempts"]["training_error"] == 0
        events = await f.events(job_id)
        expired_at = at(_event(events, "lease_expired", epoch=1)["time"])
        requeued = _event(events, "requeued")
        assert requeued["reason"] == "transport_lost" and requeued["epoch"] == 1
        assert child_died < expired_at and all(r["t"] < child_died for r in f.runs(job_id) if r["epoch"] == 1)
        first_run, second_run = f.started(job_id)
        assert first_run["resumed_from"] == 0 and second_run["resumed_from"] in f.last_checkpoints(job_id, 1)
        assert done["signal"] is None  # a finished job carries no signal
        print(f"\n[measured] SIGKILL -> training process gone: {child_died - killed_at:.2f}s; "
              f"-> no_signal since: {no_signal_after:.2f}s; -> lease expired: {expired_at - killed_at:.2f}s")


async def test_a_hung_training_process_shows_stuck_on_the_job_and_its_executor_with_an_event(env, tmp_path):
    import nats

    from libs.contracts.nodes import SignalChanged

    async with fleet(env, tmp_path / "fleet", stuck_after=2.0) as f:
        nc = await nats.connect(f.nats_url)
        changes: list[SignalChanged] = []

        async def on_signal(msg) -> None:
            changes.append(SignalChanged.decode(msg.data))

        await nc.subscribe(f"{env.prefix}.job.*.signal", cb=on_signal)
        try:
            f.start_executor("hangs")
            await f.wait_executors("hangs")
            job_id = await f.submit(f.spec("hangs", steps=100, step_seconds=0.05, HANG_AT_STEP="3"))
            (hang,) = await eventually(lambda: [r for r in f.runs(job_id) if r["event"] == "hang"], 30, "the hang")
            job = await f.wait_job(job_id, lambda j: _signal(j) == "stuck", 15, "stuck")
            seen_after = time.time() - hang["t"]
            sig = job["signal"]
            # threshold max(stuck_after 2 s, 2 x progress interval 0.5 s); heartbeats still fresh
            assert sig["stuck_after_seconds"] == 2.0 and sig["seconds_since_step_change"] > 2.0
            assert sig["seconds_since_heartbeat"] < sig["no_signal_after_seconds"]
            # Within the threshold: the step's last change is seen at most one heartbeat late, judged every 0.25 s.
            assert seen_after < 2.0 + 1.0 + 0.25 + 1.5, seen_after
            entry = (await f.executor_entries())["hangs"]
            assert (entry["signal"], entry["job_id"], entry["phase"], entry["step"]) == ("stuck", job_id, "training", 3)
            stuck = await eventually(lambda: [c for c in changes if c.job_id == job_id and c.signal == "stuck"], 10,
                                     "the stuck event")
            assert stuck[0].previous == "ok" and stuck[0].executor_id == "hangs"
            assert stuck[0].seconds_since_step_change > 2.0 and stuck[0].stuck_after_seconds == 2.0
            print(f"\n[measured] last step -> stuck shown: {seen_after:.2f}s (threshold 2s)")

            # Cancelling stops the hung process; the cancelled job carries no signal.
            r = await f.http.post(f"/v1/jobs/{job_id}/cancel", json={"reason": "hung"})
            assert r.status_code == 200, r.text
            await eventually(lambda: process_gone(hang["pid"]), 15, "the hung process to stop")
            assert (await f.job(job_id))["signal"] is None
        finally:
            await nc.close()


async def test_a_training_script_that_raises_spends_attempts_until_the_job_fails_with_its_error(env, tmp_path):
    async with fleet(env, tmp_path / "fleet") as f:
        f.start_executor("x")
        await f.wait_executors("x")
        job_id = await f.submit(f.spec("raises", steps=10, step_seconds=0.02, RAISE_AT_STEP="3", max_attempts=2))
        done = await f.wait_done(job_id, timeout=60)
        assert done["state"] == "failed", done
        assert "RuntimeError: loss diverged at step 3" in done["error"] and done["reason"] == done["error"]
        assert done["attempts"]["training_error"] == 2 and done["attempts"]["transport_lost"] == 0
        events = [(e["event"], e["epoch"]) for e in await f.events(job_id)]
        assert events.count(("attempt_failed", 1)) == 1 and events.count(("attempt_failed", 2)) == 1
        assert ("requeued", 1) in events and events[-1] == ("failed", 2)
        assert [r["epoch"] for r in f.started(job_id)] == [1, 2]


def test_an_executor_with_an_unsafe_lease_contract_refuses_to_start_with_the_reason(env):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "teto.cli", "executor", "--executor-id", "unsafe"],
                          env=env.env_vars(TETO_LEASE_SECONDS="2.5", TETO_HEARTBEAT_SECONDS="1",
                                           TETO_STOP_MARGIN_SECONDS="1"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "lease 2.5s is shorter than two heartbeats (2s) plus the stop margin (1s)" in proc.stderr
