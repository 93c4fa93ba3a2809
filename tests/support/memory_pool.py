"""A database-less stand-in for the ``asyncpg`` pool a handler takes from the broker's context (the in-memory
tier, tests/unit/test_*_inmemory.py): ``acquire()`` yields one connection whose queries are answered by the test's
double of the tables (``answer(method, query, args)``), each call kept with whether a transaction was open, so a
test reads what the handler asked, in which transaction, and what it wrote."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

Answer = Callable[[str, str, tuple], Any]


@dataclass(frozen=True)
class Call:
    method: str  # fetch, fetchrow, fetchval, execute, executemany
    query: str
    args: tuple
    in_transaction: bool


class MemoryConn:
    """``asyncpg.Connection`` as the stores use it: queries, transactions (nested ones count as one)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.calls: list[Call] = []
        self.transactions = 0  # outermost transactions opened
        self._depth = 0

    def is_in_transaction(self) -> bool:
        return self._depth > 0

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        self.transactions += self._depth == 0
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def _call(self, method: str, query: str, args: tuple) -> Any:
        self.calls.append(Call(method, query, args, self.is_in_transaction()))
        return self.answer(method, query, args)

    async def fetch(self, query: str, *args: Any) -> Any:
        return self._call("fetch", query, args)

    async def fetchrow(self, query: str, *args: Any) -> Any:
        return self._call("fetchrow", query, args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        return self._call("fetchval", query, args)

    async def execute(self, query: str, *args: Any) -> Any:
        return self._call("execute", query, args)

    async def executemany(self, query: str, rows: Any) -> Any:
        return self._call("executemany", query, (list(rows),))


class MemoryPool:
    """``asyncpg.Pool``: one connection (``conn``), lent by ``acquire()``; the pool's own query shortcuts go to it."""

    def __init__(self, answer: Answer) -> None:
        self.conn = MemoryConn(answer)
        self.acquired = 0

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[MemoryConn]:
        self.acquired += 1
        yield self.conn

    async def fetch(self, query: str, *args: Any) -> Any:
        return await self.conn.fetch(query, *args)

    async def fetchrow(self, query: str, *args: Any) -> Any:
        return await self.conn.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        return await self.conn.fetchval(query, *args)

    async def execute(self, query: str, *args: Any) -> Any:
        return await self.conn.execute(query, *args)
