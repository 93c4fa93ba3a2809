"""One real service for bench/bench_fleet.py, in its own process (settings from ``TETO_*`` as deployed):
``python -m bench._fleet_service queue|health|budget [PASSES_FILE]``.

For the health service, each pass of the signal evaluator is appended to PASSES_FILE as ``start end`` (wall
clock, seconds), and each batch of heartbeats it handled to PASSES_FILE + ``.batches`` as ``start end`` and the
batch's ``executor_id:sent_at:in_stream`` (the handler's start, after the edge fetched and decoded the batch, its
end, after the commit, and when JetStream stored each heartbeat): the bench splits a heartbeat's signal lag into its parts (``bench_fleet.breakdown``). The
service is otherwise unchanged: its own ``serve()``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time

from faststream import Context


def _record_passes(path: str) -> None:
    from services.health.evaluator import Evaluator

    evaluate = Evaluator.evaluate
    out = open(path, "a", buffering=1)  # noqa: SIM115 - the process's lifetime

    async def timed(*args, **kwargs):
        start = time.time()
        result = await evaluate(*args, **kwargs)
        out.write(f"{start:.6f} {time.time():.6f}\n")
        return result

    Evaluator.evaluate = timed


def stream_time(reply: str | None) -> float:
    """When JetStream stored a message (wall clock, seconds), from its ack subject ($JS.ACK.<stream>.<consumer>.
    <delivered>.<stream seq>.<consumer seq>.<nanoseconds>.<pending>, or with a domain and account hash before
    the stream); 0.0 if it has none."""
    tokens = (reply or "").split(".")
    if tokens[:2] != ["$JS", "ACK"] or not (len(tokens) == 9 or len(tokens) >= 11):
        return 0.0
    return int(tokens[7] if len(tokens) == 9 else tokens[9]) / 1e9


def _timed(consumer, out):
    """``consumer`` with its reads noting each heartbeat's time in the stream and its batches logged."""
    stored: dict[tuple[str, float], float] = {}

    def read(m):
        beat = consumer.read(m)
        stored[(beat.executor_id, beat.sent_at.timestamp())] = stream_time(m.reply)
        return beat

    async def handle(beats, heartbeats=Context(), clock=Context()):  # what health's handler asks the context for
        start = time.time()
        await consumer.handle(beats, heartbeats=heartbeats, clock=clock)
        end = time.time()
        out.write(f"{start:.6f} {end:.6f} " + " ".join(
            f"{b.executor_id}:{b.sent_at.timestamp():.6f}:{stored.pop((b.executor_id, b.sent_at.timestamp()), 0.0):.6f}"
            for b in beats) + "\n")
        out.flush()

    return dataclasses.replace(consumer, read=read, handle=handle)


def _record_batches(path: str) -> None:
    from services.health import app, handlers

    consumers = handlers.consumers
    out = open(path, "a", buffering=1 << 16)  # noqa: SIM115 - the process's lifetime; flushed a batch at a time

    def timed_consumers(*args, **kwargs):
        return [_timed(c, out) if c.durable == "health-heartbeats" else c for c in consumers(*args, **kwargs)]

    app.consumers = timed_consumers


def main(name: str, passes: str | None = None) -> None:
    if name == "health" and passes:
        _record_passes(passes)
        _record_batches(passes + ".batches")
    module = {"queue": "services.queue.app", "health": "services.health.app", "budget": "services.budget.app"}[name]
    serve = getattr(__import__(module, fromlist=["serve"]), "serve")
    asyncio.run(serve())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
