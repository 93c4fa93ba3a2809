"""One real service for bench/bench_fleet.py, in its own process (settings from ``TETO_*`` as deployed):
``python -m bench._fleet_service queue|health|budget [PASSES_FILE]``.

For the health service, each pass of the signal evaluator is appended to PASSES_FILE as ``start end`` (wall
clock, seconds), and each batch of heartbeats it handled to PASSES_FILE + ``.batches`` as ``start end`` and the
batch's ``executor_id:sent_at`` (the handler's start, after the edge fetched and decoded the batch, and its end,
after the commit): the bench splits a heartbeat's signal lag into its parts (``bench_fleet.breakdown``). The
service is otherwise unchanged: its own ``serve()``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time


def _record_passes(path: str) -> None:
    from services.health import store

    evaluate = store.evaluate
    out = open(path, "a", buffering=1)  # noqa: SIM115 - the process's lifetime

    async def timed(*args, **kwargs):
        start = time.time()
        result = await evaluate(*args, **kwargs)
        out.write(f"{start:.6f} {time.time():.6f}\n")
        return result

    store.evaluate = timed


def _timed(handle, out):
    async def timed(beats):
        start = time.time()
        await handle(beats)
        out.write(f"{start:.6f} {time.time():.6f} "
                  + " ".join(f"{b.executor_id}:{b.sent_at.timestamp():.6f}" for b in beats) + "\n")
        out.flush()

    return timed


def _record_batches(path: str) -> None:
    from services.health import app, handlers

    consumers = handlers.consumers
    out = open(path, "a", buffering=1 << 16)  # noqa: SIM115 - the process's lifetime; flushed a batch at a time

    def timed_consumers(*args, **kwargs):
        found = consumers(*args, **kwargs)
        return [dataclasses.replace(c, handle=_timed(c.handle, out)) if c.durable == "health-heartbeats" else c
                for c in found]

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
