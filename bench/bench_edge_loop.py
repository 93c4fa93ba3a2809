"""Why the services' subscribers keep the edge's loop (issue 29, docs/edge.md): FastStream 0.7.8's own batch pull
loop against the edge's loop as the subscriber's task, on one real nats-server, same batch size and fetch wait.

Two measures, each consumer on its own stream and durable, alternating:

- **a lone message**: one message published every ``GAP`` seconds (a command on an idle bus: a submit, a cancel),
  the time from its publish to its handler. FastStream's loop (``BatchPullStreamSubscriber._consume_pull``)
  fetches again until the batch is full or ``PullSub.timeout`` ran out, so it holds the message the first fetch
  brought; the edge hands it over at once.
- **a backlog**: ``N`` messages already in the stream, drained from the first delivery to the last handled.

Both loops run with ``natsfetch.install()`` (FastStream's loop would otherwise die on nats-py's bare timeout). The
edge's figures are the reference, so a ratio above 1 means FastStream's loop is slower (latency) and below 1 that it
drains slower (rate).

Run: .venv/bin/python -m bench.bench_edge_loop [LONE] [BACKLOG], or ``teto bench edge_loop``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import nats
from faststream.nats import JStream, NatsBroker, PullSub
from nats.js.api import ConsumerConfig

from bench._drain import NullReporter, row
from bench._servers import servers
from libs.contracts.subjects import Subjects
from libs.runtime import natsfetch
from libs.runtime.edge import Consumer
from libs.runtime.edge_loop import ConsumerLoop
from libs.runtime.edge_stream import EdgeBroker, subscribe

BATCH = 500  # the heartbeat consumers' batch
WAIT = 0.5  # the edge's default fetch wait (``Consumer.wait_seconds``), FastStream's ``PullSub.timeout`` here
GAP = 0.3  # between lone messages: longer than any fetch, so each arrives on an idle consumer
SUBJECTS = Subjects("benchloop")


async def _stream(js: Any, kind: str) -> tuple[str, str]:
    name, subject = SUBJECTS.stream_name(kind.upper()), f"benchloop.{kind}.x"
    await js.add_stream(name=name, subjects=[f"benchloop.{kind}.>"])
    return name, subject


async def _native(url: str, stream: str, subject: str, on_batch: Callable[[list[bytes]], None]) -> NatsBroker:
    broker = NatsBroker(url, logger=None)

    @broker.subscriber(subject, stream=JStream(stream, declare=False), durable=f"{stream}-native",
                       config=ConsumerConfig(ack_wait=30), pull_sub=PullSub(BATCH, WAIT, batch=True))
    async def handle(batch: list[bytes]) -> None:
        on_batch(batch)

    await broker.start()
    return broker


async def _edge(nc: Any, stream: str, subject: str, on_batch: Callable[[list[bytes]], None]) -> EdgeBroker:
    async def handle(batch: list[bytes]) -> None:
        on_batch(batch)

    short = stream.split("_", 1)[1]
    consumer = Consumer(subject, short, f"{stream}-edge", bytes, handle, batch=BATCH, wait_seconds=WAIT)
    broker = EdgeBroker(nc)
    loop = ConsumerLoop(nc.jetstream(), SUBJECTS, consumer, NullReporter())
    sub = subscribe(broker, SUBJECTS, consumer, loop)
    await broker.connect()
    await sub.start()
    return broker


async def _start(kind: str, url: str, nc: Any, stream: str, subject: str,
                 on_batch: Callable[[list[bytes]], None]) -> Any:
    return await (_native(url, stream, subject, on_batch) if kind == "native" else
                  _edge(nc, stream, subject, on_batch))


async def lone(kind: str, url: str, nc: Any, n: int) -> list[float]:
    """Seconds from each lone message's publish to its handler."""
    js = nc.jetstream()
    stream, subject = await _stream(js, f"lone{kind}")
    sent: dict[bytes, float] = {}
    took: list[float] = []
    seen = asyncio.Event()

    def on_batch(batch: list[bytes]) -> None:
        now = time.perf_counter()
        took.extend(now - sent[bytes(b)] for b in batch if bytes(b) in sent)
        seen.set()

    broker = await _start(kind, url, nc, stream, subject, on_batch)
    try:
        await asyncio.sleep(WAIT * 2)  # both loops idle, waiting on a fetch
        for i in range(n):
            seen.clear()
            body = f"m{i}".encode()
            sent[body] = time.perf_counter()
            await js.publish(subject, body, stream=stream)
            await asyncio.wait_for(seen.wait(), WAIT * 10)
            await asyncio.sleep(GAP)
    finally:
        await broker.stop()
    return took


async def backlog(kind: str, url: str, nc: Any, n: int) -> float:
    """Messages a second, draining ``n`` already stored, from the first handled batch to the last."""
    js = nc.jetstream()
    stream, subject = await _stream(js, f"backlog{kind}")
    await asyncio.gather(*(js.publish(subject, b"x" * 200, stream=stream) for _ in range(n)))
    count, first, last = 0, 0.0, 0.0
    done = asyncio.Event()

    def on_batch(batch: list[bytes]) -> None:
        nonlocal count, first, last
        now = time.perf_counter()
        first = first or now
        count += len(batch)
        last = now
        if count >= n:
            done.set()

    broker = await _start(kind, url, nc, stream, subject, on_batch)
    try:
        await asyncio.wait_for(done.wait(), 120)
    finally:
        await broker.stop()
    return n / max(last - first, 1e-9)


async def run(lone_n: int, backlog_n: int) -> list[dict]:
    natsfetch.install()
    with servers() as (url, _):
        nc = await nats.connect(url)
        try:
            delays: dict[str, list[float]] = {"edge": [], "native": []}
            rates: dict[str, list[float]] = {"edge": [], "native": []}
            for rnd in range(2):  # alternate, so a disturbance of the machine falls on both
                for kind in ("edge", "native") if rnd % 2 == 0 else ("native", "edge"):
                    delays[kind] += await lone(kind, url, nc, lone_n // 2)
                    rates[kind].append(await backlog(kind, url, nc, backlog_n))
                    await nc.jetstream().delete_stream(SUBJECTS.stream_name(f"LONE{kind.upper()}"))
                    await nc.jetstream().delete_stream(SUBJECTS.stream_name(f"BACKLOG{kind.upper()}"))
        finally:
            await nc.close()
    p50 = {k: statistics.median(v) * 1000 for k, v in delays.items()}
    p95 = {k: sorted(v)[int(len(v) * 0.95) - 1] * 1000 for k, v in delays.items()}
    rate = {k: statistics.median(v) for k, v in rates.items()}
    return [
        {"name": "edge loop: a lone message, publish to handler (p50 ms)", "figure": p50["native"],
         "reference": p50["edge"], "ratio": p50["native"] / p50["edge"], "unit": "ms", "target": None, "passed": None,
         "note": f"FastStream's own loop {p50['native']:.1f} ms p50 / {p95['native']:.1f} ms p95 against the edge's "
                 f"{p50['edge']:.1f} / {p95['edge']:.1f} ms; {lone_n} messages {GAP} s apart, batch {BATCH}, fetch "
                 f"wait {WAIT} s"},
        row("edge loop: a backlog drained by FastStream's own loop", backlog_n, backlog_n / rate["native"],
            backlog_n / rate["edge"], unit="msg/s", target=None,
            note=f"{backlog_n} stored messages, batch {BATCH}, handler does nothing; reference: the edge's loop"),
    ]


def main(quick: bool = False) -> list[dict]:
    return asyncio.run(run(10 if quick else 40, 5_000 if quick else 50_000))


if __name__ == "__main__":
    lone_n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    backlog_n = int(sys.argv[2]) if len(sys.argv) > 2 else 50_000
    for r in asyncio.run(run(lone_n, backlog_n)):
        print(f"{r['name']}: {r['figure']:.1f} {r['unit']} against {r['reference']:.1f}: {r['ratio']:.2f}x; "
              f"{r['note']}")
