"""What a placement pass asks PostgreSQL, recorded, and each statement's plan (EXPLAIN (ANALYZE, BUFFERS)).

``Recording`` stands in for the runtime's pool: every connection it hands out notes each statement (its text and
first arguments) and passes it on unchanged. ``explain`` replays them in one transaction that is rolled
back, the first run of each distinct statement under EXPLAIN (ANALYZE, BUFFERS) (ANALYZE executes it): restored
to the state the pass began with, each plan is of the state that statement met in the pass.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

_STATEMENT_METHODS = ("execute", "fetch", "fetchrow", "fetchval")


class _Conn:
    def __init__(self, conn: asyncpg.Connection, seen: list[tuple[str, tuple]], calls: list[tuple[str, int]]) -> None:
        self._conn = conn
        self._seen = seen
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._conn, name)
        if name in _STATEMENT_METHODS:
            async def call(query: str, *args: Any, **kw: Any) -> Any:
                self._seen.append((query, args))
                self._calls.append((query, 1))
                return await attr(query, *args, **kw)
            return call
        if name == "executemany":
            async def many(query: str, rows: Any, **kw: Any) -> Any:
                rows = list(rows)
                self._calls.append((query, len(rows)))
                if rows:
                    self._seen.append((query, tuple(rows[0])))
                    self._seen.extend((query, tuple(r)) for r in rows[1:])
                return await attr(query, rows, **kw)
            return many
        return attr


class Recording:
    """A pool that records the statements run on the connections it lends: ``statements``, each statement run
    with its arguments in order (an ``executemany`` is one per row), and ``calls``, each call with its number of
    rows (an ``executemany`` is one call, pipelined: one round trip)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.statements: list[tuple[str, tuple]] = []
        self.calls: list[tuple[str, int]] = []

    @contextlib.asynccontextmanager
    async def _acquire(self) -> AsyncIterator[_Conn]:
        async with self.pool.acquire() as conn:
            yield _Conn(conn, self.statements, self.calls)

    def acquire(self) -> contextlib.AbstractAsyncContextManager[_Conn]:
        return self._acquire()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)


def distinct(statements: list[tuple[str, tuple]]) -> list[tuple[str, tuple, int]]:
    """Each statement text once (its first arguments), with how many times the pass ran it."""
    out: dict[str, tuple[tuple, int]] = {}
    for query, args in statements:
        first, n = out.get(query, (args, 0))
        out[query] = (first, n + 1)
    return [(q, a, n) for q, (a, n) in out.items()]


def seq_scans(plan: str, table: str) -> list[str]:
    """The plan's lines that scan ``table`` sequentially (a plain ``Seq Scan on table``, any alias)."""
    return [ln.strip() for ln in plan.splitlines() if re.search(rf"Seq Scan on (\w+\.)?{table}\b", ln)]


async def explain(conn: asyncpg.Connection, statements: list[tuple[str, tuple]], *,
                  index_paths: bool = False) -> list[dict]:
    """The pass replayed in one transaction that is rolled back: each statement in its order, the first run of
    each distinct text under EXPLAIN (ANALYZE, BUFFERS) (so each plan is of the state that statement met).
    ``index_paths``: with sequential scans priced out (``enable_seqscan = off``), so a plan still scanning a
    table has no index to use at all: the check for a small table, where a seq scan is rightly cheapest."""
    counts = {q: n for q, _, n in distinct(statements)}
    plans: dict[str, dict] = {}
    tr = conn.transaction()
    await tr.start()
    try:
        if index_paths:
            await conn.execute("SET LOCAL enable_seqscan = off")
        for query, args in statements:
            if query in plans:
                await conn.execute(query, *args)
                continue
            text = "\n".join(r[0] for r in await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {query}", *args))
            plans[query] = {"query": " ".join(query.split()), "runs_per_pass": counts[query], "plan": text,
                            "seq_scan_jobs": seq_scans(text, "jobs")}
    finally:
        await tr.rollback()
    return list(plans.values())
