"""Shared measuring for the benchmarks that drain a stream: a plain nats-py pull consumer (the reference) and the
time a real service's durable takes to acknowledge everything in its stream."""

from __future__ import annotations

import asyncio
import time


async def gather_in_chunks(coros, chunk: int = 500) -> None:
    """Await many publishes concurrently, ``chunk`` at a time (all at once would flood the connection)."""
    pending = []
    for coro in coros:
        pending.append(coro)
        if len(pending) >= chunk:
            await asyncio.gather(*pending)
            pending = []
    await asyncio.gather(*pending)


def row(name: str, n: int, seconds: float, ref_seconds: float, *, unit: str = "msg/s", target: float | None = 0.5,
        note: str = "") -> dict:
    """One result row: the rate of n messages in seconds against the reference's rate, as ``teto bench`` reads it."""
    figure, reference = n / seconds, n / ref_seconds
    ratio = figure / reference
    return {"name": name, "figure": figure, "reference": reference, "ratio": ratio, "target": target, "unit": unit,
            "passed": None if target is None else ratio >= target, "note": note}


async def reference(js, subject: str, stream: str, durable: str, n: int, batch: int = 500) -> float:
    """Seconds a plain pull consumer (fetch ``batch``, ack each) takes from its first delivery to its n-th ack."""
    sub = await js.pull_subscribe(subject, durable=durable, stream=stream)
    got, t0 = 0, None
    while got < n:
        try:
            msgs = await sub.fetch(batch, timeout=1.0)
        except asyncio.TimeoutError:
            continue
        t0 = t0 or time.perf_counter()
        for m in msgs:
            await m.ack()
        got += len(msgs)
    await sub.unsubscribe()
    return time.perf_counter() - t0


async def drained_by(js, stream: str, durable: str) -> float:
    """Seconds from the durable's first delivery to every message of the stream acknowledged (polled every 5 ms)."""
    last = (await js.stream_info(stream)).state.last_seq
    t0 = None
    while True:
        try:
            info = await js.consumer_info(stream, durable)
        except Exception:  # noqa: BLE001 - not created yet
            await asyncio.sleep(0.005)
            continue
        if t0 is None and info.delivered.stream_seq > 0:
            t0 = time.perf_counter()
        if info.ack_floor.stream_seq >= last and info.num_ack_pending == 0:
            return time.perf_counter() - (t0 or time.perf_counter())
        await asyncio.sleep(0.005)


async def service_rate(serve, settings, js, durables: list[tuple[str, str]], timeout: float = 900) -> list[float]:
    """Run a service in this loop until each (stream, durable) has acknowledged its whole stream; the seconds each
    took from its own first delivery. A service's durables are measured in one run, as they run in production:
    stopping a service mid-batch would leave fetched messages unacknowledged until their ack wait (15 s)."""
    task = asyncio.create_task(serve(settings))
    try:
        return list(await asyncio.wait_for(asyncio.gather(*(drained_by(js, st, d) for st, d in durables)), timeout))
    finally:
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):  # noqa: BLE001 - stopping
            pass


class NullReporter:
    """What the edge reports to (refusals, dead letters), for benchmarks that measure the loop and not the reports."""

    name = "bench"

    async def reject(self, subject: str, body: bytes, reason: str) -> None:
        return None

    async def bury(self, letter: object) -> None:
        return None
