"""Heartbeat ingest through the edge (libs/runtime/edge.py) against the reference of a plain nats-py pull
consumer draining the same stream (fetch 500, ack each), measured in the same run.

N heartbeats from E simulated executors are published to the HB stream first; then each consumer drains them
from the beginning: the reference, then the queue's and the health service's real heartbeat consumers (their
own declarations and handlers, on migrated schemas). A rate is the messages over the time from the consumer's
first delivery to its last acknowledgement. Before the edge, the queue's consumer fetched one message at a time
(about 440/s here).

Run: .venv/bin/python -m bench.bench_ingest [N] [EXECUTORS]
"""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import UTC, datetime

from bench._servers import servers
from libs.contracts.telemetry import Heartbeat
from libs.runtime import bus
from libs.runtime.service import Runtime
from libs.runtime.settings import CommonSettings

PREFIX = "bench"


async def publish(js, subjects, n: int, executors: int) -> None:
    now = datetime.now(UTC)
    pending = []
    for i in range(n):
        ex = f"ex{i % executors}"
        beat = Heartbeat(executor_id=ex, node_id=f"n-{ex}", group="g", sent_at=now, interval_seconds=30,
                         progress_interval_seconds=30)
        pending.append(js.publish(subjects.heartbeat(ex), beat.encode()))
        if len(pending) >= 500:
            await asyncio.gather(*pending)
            pending = []
    await asyncio.gather(*pending)


async def reference(js, subjects, n: int) -> float:
    sub = await js.pull_subscribe(subjects.heartbeat_all, durable="bench-raw", stream=subjects.stream_name("HB"))
    got, t0 = 0, None
    while got < n:
        try:
            msgs = await sub.fetch(500, timeout=1.0)
        except asyncio.TimeoutError:
            continue
        t0 = t0 or time.perf_counter()
        for m in msgs:
            await m.ack()
        got += len(msgs)
    return time.perf_counter() - t0


async def drained_by(js, subjects, durable: str, n: int) -> float:
    """Seconds from the durable's first delivery to every message acknowledged (polled every 20 ms)."""
    stream = subjects.stream_name("HB")
    t0 = None
    while True:
        try:
            info = await js.consumer_info(stream, durable)
        except Exception:  # noqa: BLE001 - not created yet
            await asyncio.sleep(0.02)
            continue
        if t0 is None and info.delivered.stream_seq > 0:
            t0 = time.perf_counter()
        if info.ack_floor.stream_seq >= n and info.num_ack_pending == 0:
            return time.perf_counter() - (t0 or time.perf_counter())
        await asyncio.sleep(0.02)


async def service_rate(serve, settings, js, subjects, durable: str, n: int) -> float:
    task = asyncio.create_task(serve(settings))
    try:
        return await asyncio.wait_for(drained_by(js, subjects, durable, n), 600)
    finally:
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping
            pass


async def run(n: int, executors: int) -> None:
    from services.health.app import serve as health
    from services.health.settings import HealthSettings
    from services.queue.app import serve as queue
    from services.queue.settings import QueueSettings

    with servers() as (nats_url, pg_url):
        base = dict(nats_url=nats_url, database_url=pg_url, subject_prefix=PREFIX)
        rt = await Runtime.open("bench", CommonSettings.from_env(env={}, **base), schema=None, package=None)
        subjects = rt.subjects
        await publish(rt.js, subjects, n, executors)
        ref = await reference(rt.js, subjects, n)
        rows = [("plain nats-py pull consumer (reference)", ref)]
        rows.append(("queue heartbeats (edge)", await service_rate(
            queue, QueueSettings.from_env(env={}, **base), rt.js, subjects, "queue-heartbeats", n)))
        rows.append(("health heartbeats (edge)", await service_rate(
            health, HealthSettings.from_env(env={}, **base), rt.js, subjects, "health-heartbeats", n)))
        await rt.close()
    print(f"\nheartbeat ingest: {n} heartbeats from {executors} executors, one server of each, this machine")
    print(f"{'consumer':44} {'msgs/s':>9} {'ratio':>6}  target")
    for name, seconds in rows:
        rate = n / seconds
        ratio = rate / (n / ref)
        target = "" if name.endswith("(reference)") else (">= 0.5  " + ("pass" if ratio >= 0.5 else "short"))
        print(f"{name:44} {rate:9.0f} {ratio:6.2f}  {target}")


if __name__ == "__main__":
    asyncio.run(run(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000,
                    int(sys.argv[2]) if len(sys.argv) > 2 else 2_000))
