"""Waking a singleton loop at once instead of at its next tick, in whichever replica holds it.

A unit of work that makes the loop's work possible (a job queued, an executor freed) calls ``notify`` in its own
transaction: PostgreSQL delivers the notification on commit, to every listening connection, so the replica that
holds the loop (``Waker.listening``) wakes whichever replica committed, and never before the change is visible.
The loop's timer stays as the floor: a lost notification (the listening connection dropped) only costs the wait
until the next tick, as before.

Wakes that keep coming (a burst of submits, each queueing a job) would otherwise run pass after pass with no
pause, and the passes would take the whole event loop from the service's other work (the submits themselves:
issue 12, docs/performance.md). A wake that came during a pass therefore starts the next pass after a rest as long
as that pass took (``DUTY``: passes take at most half the time while wakes keep coming); a wake after an idle
spell starts a pass at once, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg

from .singleton import periodic

log = logging.getLogger(__name__)


def channel(prefix: str, name: str) -> str:
    """The notification channel of loop ``name`` under a subject prefix (a plain identifier under 63 bytes)."""
    return f"teto_{name}_{hashlib.sha256(prefix.encode()).hexdigest()[:16]}"


async def notify(conn: asyncpg.Connection, name: str) -> None:
    """Wake the loop listening on ``name`` once the caller's transaction commits (nothing if it rolls back)."""
    await conn.execute("SELECT pg_notify($1, '')", name)


DUTY = 0.5  # the most of the time back-to-back passes may take while wakes keep coming


def rest_before_next(worked: float, duty: float, cap: float) -> float:
    """How long a loop woken during a pass that took ``worked`` seconds rests before the next pass, so that
    passes take at most ``duty`` of the time: ``worked * (1 - duty) / duty``, never more than ``cap`` (the tick,
    which bounds the wait anyway) nor less than nothing."""
    if not 0 < duty <= 1:
        raise ValueError(f"duty {duty} is outside (0, 1]")
    return max(0.0, min(cap, worked * (1 - duty) / duty))


class Waker:
    """The loop's side: an event set by notifications (or in-process by ``set``), awaited between ticks."""

    def __init__(self, dsn: str, name: str, *, duty: float = DUTY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.dsn = dsn
        self.name = name
        self.event = asyncio.Event()
        self.duty = duty
        self.clock = clock
        self.woken = 0  # passes started by a wake rather than the timer
        self.rested = 0.0  # seconds of rest between back-to-back passes (module docstring)
        self._began: float | None = None  # when the pass now running began

    def set(self, *_: object) -> None:
        self.event.set()

    async def sleep(self, seconds: float) -> None:
        """Until woken or ``seconds`` have passed; a wake that came while the loop worked ends it after a rest as
        long as the pass took (``rest_before_next``)."""
        if self.event.is_set() and self._began is not None:
            rest = rest_before_next(self.clock() - self._began, self.duty, seconds)
            if rest > 0:
                self.rested += rest
                await asyncio.sleep(rest)
        try:
            await asyncio.wait_for(self.event.wait(), seconds)
            self.woken += 1
        except TimeoutError:
            pass
        self.event.clear()
        self._began = self.clock()

    @contextlib.asynccontextmanager
    async def listening(self) -> AsyncIterator[None]:
        conn: asyncpg.Connection | None = None
        try:
            conn = await asyncpg.connect(self.dsn)
            await conn.add_listener(self.name, self.set)
        except (OSError, asyncpg.PostgresError) as exc:  # the timer alone still drives the loop
            log.warning("%s: cannot listen for wakes (%r); running on the timer alone", self.name, exc)
        try:
            yield
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close(timeout=2)


def wakeable(fn: Callable[[], Awaitable[object]], every: float, name: str,
             waker: Waker) -> Callable[[], Awaitable[None]]:
    """Like ``singleton.periodic``, but a wake starts the next pass at once (one that came during a pass too:
    ``Waker.sleep`` finds the event already set)."""
    passes = periodic(fn, every, name, sleep=waker.sleep)

    async def loop() -> None:
        async with waker.listening():
            await passes()

    return loop
