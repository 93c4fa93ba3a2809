"""Loops that must run in exactly one replica (lease scanner, outbox relay, scheduler).

Each replica tries a PostgreSQL session advisory lock on a dedicated connection; the holder runs the loop.
If the holder dies, its connection closes, the lock is released and another replica takes it over on its next
try (within ``retry_seconds``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import asyncpg

from .db import lock_key
from .loophealth import CURRENT
from .tasks import stop_tasks

log = logging.getLogger(__name__)


class SingletonLoop:
    def __init__(self, dsn: str, name: str, body: Callable[[], Awaitable[None]], *, retry_seconds: float = 1.0):
        self.dsn = dsn
        self.name = name
        self.body = body
        self.retry_seconds = retry_seconds
        self.leader = False

    async def run(self) -> None:
        key = lock_key(f"singleton:{self.name}")
        tasks: set[asyncio.Task] = set()
        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(self.dsn)
                while not await conn.fetchval("SELECT pg_try_advisory_lock($1)", key):
                    await asyncio.sleep(self.retry_seconds)
                self.leader = True
                log.info("%s: this replica is the leader", self.name)
                tasks = {asyncio.create_task(self.body()), asyncio.create_task(_watch(conn, self.retry_seconds))}
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    if not t.cancelled() and t.exception():
                        log.warning("%s: leader loop ended: %r", self.name, t.exception())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - database gone: retry as follower
                log.warning("%s: %s", self.name, exc)
            finally:
                self.leader = False
                # Cancelled or not, the body must not outlive leadership (it would run against a closed pool).
                await stop_tasks(list(tasks))
                tasks = set()
                if conn is not None:
                    try:
                        await conn.close(timeout=2)
                    except Exception:  # noqa: BLE001
                        conn.terminate()
            await asyncio.sleep(self.retry_seconds)


async def _watch(conn: asyncpg.Connection, every: float) -> None:
    """Ends when the lock connection dies, so the loop stops being leader at once."""
    while True:
        await asyncio.sleep(every)
        await conn.fetchval("SELECT 1")


def periodic(fn: Callable[[], Awaitable[object]], every: float, name: str, *,
             sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> Callable[[], Awaitable[None]]:
    """``fn`` every ``every`` seconds; ``sleep`` may end a wait early (libs/runtime/wake.py)."""
    async def loop() -> None:
        health = CURRENT.get()  # the runtime's, set on the task that runs this loop (loophealth.py)
        while True:
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a failing tick is logged and retried next tick
                log.exception("%s tick failed", name)
                if health is not None:
                    health.failed(name, exc)
            else:
                if health is not None:
                    health.succeeded(name)
            await sleep(every)

    return loop
