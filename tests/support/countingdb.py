"""A pool whose connections count their round trips to PostgreSQL: what a test of "statements per batch"
measures (each execute/fetch/executemany is one round trip, a transaction's BEGIN and COMMIT two more).
Everything else passes through to the real asyncpg pool and connection."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

_CALLS = ("execute", "executemany", "fetch", "fetchrow", "fetchval")


class CountingConnection:
    def __init__(self, conn: asyncpg.Connection, counts: Counter) -> None:
        self._conn = conn
        self._counts = counts

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._conn, name)
        if name not in _CALLS:
            return target

        async def counted(*args: Any, **kw: Any) -> Any:
            self._counts[name] += 1
            self._counts["round_trips"] += 1
            return await target(*args, **kw)
        return counted

    def transaction(self, **kw: Any) -> Any:
        counts = self._counts
        inner = self._conn.transaction(**kw)

        @contextlib.asynccontextmanager
        async def counted() -> AsyncIterator[None]:
            counts["round_trips"] += 2  # BEGIN, COMMIT (or ROLLBACK)
            async with inner:
                yield
        return counted()


class CountingPool:
    """Wraps a pool: ``counts['round_trips']`` is every round trip made on connections acquired from it."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self.counts: Counter = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[CountingConnection]:
        async with self._pool.acquire() as conn:
            yield CountingConnection(conn, self.counts)

    def reset(self) -> None:
        self.counts.clear()
