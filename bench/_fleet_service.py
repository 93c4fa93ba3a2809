"""One real service for bench/bench_fleet.py, in its own process (settings from ``TETO_*`` as deployed):
``python -m bench._fleet_service queue|health|budget [PASSES_FILE]``.

For the health service, each pass of the signal evaluator is appended to PASSES_FILE as ``start end`` (wall
clock, seconds): the bench turns a heartbeat's arrival in health's table into the time its signal was judged
(the end of the first pass that began after it). The service is otherwise unchanged: its own ``serve()``.
"""

from __future__ import annotations

import asyncio
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


def main(name: str, passes: str | None = None) -> None:
    if name == "health" and passes:
        _record_passes(passes)
    module = {"queue": "services.queue.app", "health": "services.health.app", "budget": "services.budget.app"}[name]
    serve = getattr(__import__(module, fromlist=["serve"]), "serve")
    asyncio.run(serve())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
