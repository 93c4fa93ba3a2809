"""GPU-ceiling overshoot at the default heartbeat (30 s), one worker, ceiling 40 GPU-seconds: before (the grant
carries no remaining GPU-seconds, so the stop can only follow the usage reports, sent once a heartbeat) against
after (the grant carries them and the agent stops by its own monotonic clock), measured in the same run.

A real executor agent (agents.executor.main.serve) runs a CPU-only process (one device) that exits at once on
SIGTERM, against the embedded NATS server. The test plays the budget and the queue, in their favour: it charges
every usage record the moment it arrives and sends the ceiling stop directive as soon as the charged total
reaches the ceiling (no stream, database or outbox latency), in both runs; in the "after" run that stop finds
the run already stopping. Overshoot = GPU-seconds charged by the run's usage records - the ceiling.

Run: .venv/bin/python -m bench.bench_overshoot [--quick]
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from agents.executor.main import serve
from agents.executor.settings import ExecutorSettings
from libs.contracts.agents import RunJob, StopJob
from libs.contracts.jobs import CommandWorkload, JobSpec
from libs.contracts.leases import LeaseRenewReply
from libs.contracts.telemetry import RunFinished
from libs.contracts.usage import UsageReport
from libs.runtime import bus

from bench._servers import servers

GRACE = 10.0  # the default TETO_STOP_GRACE_SECONDS (the process below exits at once on the stop anyway)
POLITE = ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n"
          "while True:\n    time.sleep(0.02)\n")


async def _one(settings: ExecutorSettings, ceiling: float, remaining: float | None) -> float:
    """Grant one run, play budget and queue until it ends, return its overshoot in GPU-seconds."""
    nc = await bus.connect(settings.nats_url, "bench")
    js = nc.jetstream()
    subjects, job = settings.subjects, uuid.uuid4().hex
    charged, stopped, finished, last = [0.0], [False], asyncio.Event(), asyncio.Event()

    async def on_renew(msg) -> None:
        await msg.respond(LeaseRenewReply(ok=True).encode())

    async def on_usage(msg) -> None:
        for r in UsageReport.decode(msg.data).records:
            if r.job_id != job:
                continue
            charged[0] += r.devices * r.wall_seconds
            if r.last:
                last.set()
        if charged[0] >= ceiling and not stopped[0]:
            stopped[0] = True
            await bus.publish(js, subjects.agent(settings.executor_id, "stop"),
                              StopJob(job_id=job, epoch=1, reason="gpu_ceiling", checkpoint_first=True,
                                      grace_seconds=GRACE))

    async def on_progress(msg) -> None:
        if b'"finished"' in msg.data and RunFinished.decode(msg.data).job_id == job:
            finished.set()

    subs = [await nc.subscribe(subjects.rpc_lease_renew, cb=on_renew),
            await nc.subscribe(subjects.usage_all, cb=on_usage),
            await nc.subscribe(subjects.progress_all, cb=on_progress)]
    try:
        grant = RunJob(job_id=job, epoch=1, executor_id=settings.executor_id, attempt=1,
                       spec=JobSpec(workload=CommandWorkload(command=[sys.executable, "-c", POLITE]),
                                    gpu_ceiling_seconds=ceiling),
                       lease_seconds=settings.lease_seconds, heartbeat_seconds=settings.heartbeat_seconds,
                       remaining_gpu_seconds=remaining)
        await bus.publish(js, subjects.agent(settings.executor_id, "run"), grant)
        limit = ceiling + 3 * settings.heartbeat_seconds + GRACE + 30
        await asyncio.wait_for(finished.wait(), limit)
        await asyncio.wait_for(last.wait(), 2 * settings.heartbeat_seconds + 5)
        return charged[0] - ceiling
    finally:
        for s in subs:
            with contextlib.suppress(Exception):
                await s.unsubscribe()
        await nc.close()


async def _measure(nats_url: str, pg_url: str, ceiling: float, heartbeat: float) -> tuple[float, float]:
    data = Path(tempfile.mkdtemp(prefix="teto-bench-overshoot-"))
    settings = ExecutorSettings.from_env(
        env={}, nats_url=nats_url, database_url=pg_url, subject_prefix="b" + uuid.uuid4().hex[:8], data_dir=data,
        executor_id=f"ex-{uuid.uuid4().hex[:6]}", heartbeat_seconds=heartbeat, lease_seconds=max(6.0, 3 * heartbeat),
        stop_grace_seconds=GRACE)
    ready = asyncio.Event()
    agent = asyncio.create_task(serve(settings, ready=ready))
    try:
        await asyncio.wait_for(ready.wait(), 60)
        before = await _one(settings, ceiling, None)
        print(f"overshoot before (remaining unknown): {before:.3f} GPU-s", file=sys.stderr, flush=True)
        after = await _one(settings, ceiling, ceiling)
        print(f"overshoot after (the agent's own clock): {after:.3f} GPU-s", file=sys.stderr, flush=True)
        return before, after
    finally:
        agent.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(asyncio.shield(agent), 15)


def main(quick: bool = False) -> dict:
    ceiling, heartbeat = (4.0, 3.0) if quick else (40.0, 30.0)
    started = time.monotonic()
    with servers() as (nats_url, pg_url):
        # Not asyncio.run: it would wait on the agent's directive fetch, which may outlive its cancellation
        # (the tests leave it too, see tests/support/services.stop_tasks); the loop is dropped with it.
        loop = asyncio.new_event_loop()
        try:
            before, after = loop.run_until_complete(_measure(nats_url, pg_url, ceiling, heartbeat))
        finally:
            with contextlib.suppress(Exception):
                loop.close()
    target = 1.0  # GPU-seconds per device, plus the grace the process takes to checkpoint (none here)
    return {"name": "overshoot", "figure": round(after, 3), "reference": round(before, 3),
            "ratio": round(after / before, 4) if before > 0 else None, "target": target, "unit": "GPU-s",
            "passed": after <= target,
            "note": (f"GPU-ceiling overshoot, one CPU-only worker, ceiling {ceiling:g} GPU-s, heartbeat "
                     f"{heartbeat:g}s: the agent's own clock (figure) vs stops that follow usage reports "
                     f"(reference, budget and queue played with zero latency); {time.monotonic() - started:.0f}s")}


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    print(main(quick="--quick" in sys.argv))
