"""Leases and signals under real faults: real NATS and PostgreSQL, the queue, health and gateway services, and
executor agents as subprocesses running a real training script (tests/support/fault_workload.py).

Timings (tests/conftest.py): lease 6 s, heartbeat 1 s, stop margin 1.5 s; the queue scans leases every 0.5 s.
So an executor cut off gives up 4.5 s after its last acknowledged renewal and the queue redelivers 6 s after
the last renewal it received: the training process must be dead in between.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.support.fleet import at, death_of, eventually, fleet, process_gone
from tests.support.proxy import TcpProxy

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
            # It resumed from the last checkpoint the first run wrote, not from scratch.
            last_ckpt = max(r["step"] for r in f.runs(job_id) if r["event"] == "checkpoint" and r["epoch"] == 1)
            assert [r["resumed_from"] for r in f.started(job_id)] == [0, last_ckpt]
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


async def _stale_entry(f, executor_id: str) -> dict | None:
    entry = (await f.executor_entries()).get(executor_id)
    return entry if entry and entry["stale_reports"] else None
