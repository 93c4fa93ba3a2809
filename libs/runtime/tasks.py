"""Stopping asyncio tasks for sure.

nats-py swallows a ``CancelledError`` that lands in its publish path (``except asyncio.CancelledError: pass`` in
the client's send/flush), so a single cancel can leave a loop that publishes running, and a plain ``await`` on
it then hangs forever: a service that never stops, a test that never ends. Every place that stops tasks goes
through ``stop_tasks``.
"""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger(__name__)


async def stop_tasks(tasks: list[asyncio.Task], *, timeout: float = 10.0) -> list[asyncio.Task]:
    """Cancel tasks and wait for them, cancelling again any that goes on (see the module docstring). Returns the
    tasks still running after ``timeout`` (logged)."""
    pending = {t for t in tasks if not t.done()}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.2)
    for t in pending:
        log.error("task %s did not stop within %.0fs", t.get_name(), timeout)
    return list(pending)
