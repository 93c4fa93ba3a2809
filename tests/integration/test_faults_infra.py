"""Faults of the infrastructure under a running fleet: the NATS server restarted mid-run, and the queue replica
that scans leases killed (with real queue processes, not tasks, so the kill is a real one)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from libs.contracts.commands import SubmitJob
from libs.contracts.jobs import CommandWorkload, JobSpec
from libs.runtime.db import lock_key
from services.queue.settings import QueueSettings
from teto.stack.embedded import EmbeddedNats
from tests.integration.helpers_queue import FakeExecutor, client
from tests.support.fleet import at, fleet
from tests.support.services import eventually

pytestmark = pytest.mark.integration


async def _published_job_events(f, job_id: str) -> list[int]:
    """Sequence numbers of the job's lifecycle events as the JOB stream holds them (signal events aside)."""
    import nats

    nc = await nats.connect(f.nats_url)
    try:
        sub = await nc.jetstream().pull_subscribe(f"{f.env.prefix}.job.{job_id}.>", durable=None)
        seqs: list[int] = []
        while True:
            try:
                msgs = await sub.fetch(100, timeout=1.0)
            except TimeoutError:
                return seqs
            for m in msgs:
                body = json.loads(m.data)
                if body.get("schema") == "teto.job.event/1":
                    seqs.append(body["seq"])
                await m.ack()
    finally:
        await nc.close()


async def test_a_nats_restart_mid_run_loses_nothing_and_runs_no_job_twice(env, tmp_path):
    nats_server = EmbeddedNats(tmp_path / "nats").start()
    try:
        async with fleet(env, tmp_path / "fleet", nats_url=nats_server.url) as f:
            f.start_executor("a")
            f.start_executor("b")
            await f.wait_executors("a", "b")
            jobs = [await f.submit(f.spec(f"j{i}", steps=80, step_seconds=0.05, every=10)) for i in range(3)]
            await eventually(lambda: sum(any(r["event"] == "checkpoint" for r in f.runs(j)) for j in jobs) >= 2, 60,
                             "two jobs training with a checkpoint")

            # Stop the server and start it again on the same port and store directory.
            nats_server.stop()
            down_at = time.monotonic()
            await asyncio.sleep(1.0)  # the outage itself: a second without a server
            nats_server.start()
            print(f"\n[measured] NATS down for {time.monotonic() - down_at:.2f}s")

            done = [await f.wait_done(j, timeout=120) for j in jobs]
            for job in done:
                assert job["state"] == "succeeded" and job["last_step"] == 80, job
                assert job["attempts"]["training_error"] == 0
                events = await f.events(job["id"])
                seqs = [e["seq"] for e in events]
                assert seqs == list(range(1, len(seqs) + 1)) and events[-1]["event"] == "succeeded"
                # Every event reached the JOB stream exactly once (the outbox relay survived the outage).
                published = await eventually(lambda j=job["id"], n=len(seqs): _complete(f, j, n), 15,
                                             "every event published")
                assert sorted(published) == seqs
                # No job ran twice at once: its runs never held its lock together, and one run per lease.
                runs = f.runs(job["id"])
                assert not [r for r in runs if r["event"] == "overlap"], runs
                leases = [e for e in events if e["event"] == "leased"]
                assert len([r for r in runs if r["event"] == "start"]) == len(leases) == job["lease_epoch"]
            print(f"[measured] transport_lost per job after the restart: "
                  f"{[j['attempts']['transport_lost'] for j in done]}")
    finally:
        nats_server.stop()


async def _complete(f, job_id: str, n: int) -> list[int] | None:
    seqs = await _published_job_events(f, job_id)
    return seqs if len(seqs) >= n else None


# -- the lease scanner's singleton -------------------------------------------------------------------------

LEADER = "queue-lease-scanner: this replica is the leader"


def _start_queue(env, log: Path, scan: float) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "teto.cli", "service", "queue", "--log-level", "INFO"],
                                env=env.env_vars(TETO_SCAN_INTERVAL_SECONDS=str(scan),
                                                 TETO_SCHEDULE_INTERVAL_SECONDS="0.2"),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


async def _scanner_lock_holder(db, prefix: str) -> int | None:
    """The PostgreSQL backend holding the lease scanner's advisory lock (a bigint key: classid/objid halves)."""
    key = lock_key(f"singleton:{prefix}:queue-lease-scanner") & 0xFFFFFFFFFFFFFFFF
    return await db.fetchval("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1"
                             " AND classid::bigint = $1 AND objid::bigint = $2", key >> 32, key & 0xFFFFFFFF)


async def test_the_lease_scanner_runs_in_one_queue_replica_and_another_takes_over_within_a_scan(env, tmp_path):
    scan = 0.5
    logs = {name: tmp_path / f"{name}.log" for name in ("q1", "q2")}
    procs = {name: _start_queue(env, log, scan) for name, log in logs.items()}
    settings = env.settings(QueueSettings, scan_interval_seconds=scan)
    try:
        def leaders() -> list[str]:
            return [n for n, log in logs.items() if log.exists() and LEADER in log.read_text(errors="replace")]

        def ready() -> bool:
            return all("queue service ready" in log.read_text(errors="replace") for log in logs.values()
                       if log.exists()) and len(leaders()) == 1

        await eventually(ready, 60, "both queue replicas ready, one of them scanning leases")
        async with client(settings) as c:
            ex = await FakeExecutor(c, "fx").start()
            try:
                cmd = SubmitJob(actor="tester", spec=JobSpec(workload=CommandWorkload(command=["true"])))
                assert (await c.command(cmd, timeout=20)).accepted
                run = await ex.take(timeout=20)
                assert (await ex.renew()).ok
                ex.beating = False  # the executor goes silent: its lease runs out lease_seconds after that renewal
                lease_ends = at((await c.job(run.job_id))["lease_expires_at"].isoformat())
                holder = await _scanner_lock_holder(c.db, env.prefix)
                assert holder is not None

                # Kill the scanning replica outright; the other takes the lock within one scan interval.
                (leader,) = leaders()
                os.kill(procs[leader].pid, signal.SIGKILL)
                killed_at = time.monotonic()
                new = await eventually(lambda: _new_holder(c.db, env.prefix, holder), 10, "another replica to lead")
                takeover = time.monotonic() - killed_at
                assert new != holder and takeover <= scan + 0.4, takeover
                (other,) = [n for n in logs if n != leader]
                await eventually(lambda: LEADER in logs[other].read_text(errors="replace"), 5, "the follower's log")

                # The lease still expires on time: the job is back in the queue, its attempt not spent.
                job = await c.wait_state(run.job_id, "queued", timeout=15)
                assert job["attempts"]["transport_lost"] == 1 and job["attempts"]["training_error"] == 0
                (expired,) = [e for e in await c.event_rows(run.job_id) if e["event"] == "lease_expired"]
                late = expired["time"].timestamp() - lease_ends
                assert 0 <= late <= scan + 1.0, late
                print(f"\n[measured] scanner takeover after SIGKILL: {takeover:.2f}s (scan {scan}s); "
                      f"lease expiry noticed {late:.2f}s after the lease ended")
            finally:
                await ex.stop()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs.values():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


async def _new_holder(db, prefix: str, old: int) -> int | None:
    pid = await _scanner_lock_holder(db, prefix)
    return pid if pid is not None and pid != old else None
