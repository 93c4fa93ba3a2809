"""One service replica as its own process, for the fault matrix: ``python -m tests.support.replica <service>``.

It runs the service's ``serve()`` exactly as ``teto service <name>`` does (settings from ``TETO_*``), and touches
``$TETO_READY_FILE`` once ``serve()`` says it is ready, so a test waits on that file rather than on a log line
(only the queue logs one). SIGTERM/SIGINT cancel ``serve()``; SIGKILL is what the fault tests send.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import sys
from pathlib import Path


async def _main(name: str) -> None:
    serve = importlib.import_module(f"services.{name}.app").serve
    ready = asyncio.Event()
    task = asyncio.create_task(serve(ready=ready))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    waiter = asyncio.create_task(ready.wait())
    done, _ = await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if waiter in done and (path := os.environ.get("TETO_READY_FILE")):
        Path(path).write_text(str(os.getpid()))
    try:
        await task
    except asyncio.CancelledError:
        pass


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_main(sys.argv[1]))
