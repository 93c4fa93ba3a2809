"""The health evaluator writes a pass's changed signals in one statement per table (services/health/evaluator.py,
store/signals.py):
hundreds of executors going silent at once cost a fixed number of round trips, not one UPDATE each (a fleet's
pass took tens of seconds that way, holding the rows its heartbeats needed), and a row whose inputs changed
after it was read is still left for the next pass."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from libs.runtime.service import Runtime
from services.health import store
from services.health.evaluator import Evaluator
from services.health.store import signals
from services.health.settings import HealthSettings

pytestmark = pytest.mark.integration


class OnePool:
    """A pool that lends one connection (whose statements the test counts)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    @contextlib.asynccontextmanager
    async def _lend(self):
        yield self.conn

    def acquire(self):
        return self._lend()


async def test_hundreds_of_signal_changes_take_a_fixed_number_of_statements(env):
    settings = env.settings(HealthSettings)
    runtime = await Runtime.open("health", settings, schema=store.SCHEMA, package="services.health")
    try:
        now = datetime.now(UTC)
        old = now - timedelta(minutes=10)
        async with runtime.pool.acquire() as conn:
            await conn.executemany(
                "INSERT INTO health.executors (executor_id, last_heartbeat, heartbeat_interval_seconds, phase)"
                " VALUES ($1, $2, 30, 'idle')", [(f"ex{i:03d}", old) for i in range(300)])
        statements: list[str] = []
        conn = await asyncpg.connect(env.database_url)
        conn.add_query_logger(lambda q: statements.append(q.query))
        try:
            result = await asyncio.wait_for(Evaluator(OnePool(conn), settings.subjects,
                                                             settings.thresholds).evaluate(now), 60)
        finally:
            await conn.close()
        assert result.executors_changed == 300
        assert await runtime.pool.fetchval("SELECT count(*) FROM health.executors WHERE signal = 'no_signal'") == 300
        updates = [q for q in statements if q.lstrip().upper().startswith("UPDATE")]
        assert len(updates) == 1 and len(statements) < 10, statements

        # A heartbeat that lands between the read and the write keeps its row out of the pass's verdict.
        await runtime.pool.execute("UPDATE health.executors SET signal = NULL")
        real_fetch = asyncpg.Connection.fetch

        async def fetch_then_beat(self, query, *args, **kw):
            rows = await real_fetch(self, query, *args, **kw)
            if query == signals.DUE_EXECUTORS:  # the pass has read the executors
                async with runtime.pool.acquire() as other:
                    await other.execute("UPDATE health.executors SET last_heartbeat = $1 WHERE executor_id = 'ex000'",
                                        now)
            return rows

        asyncpg.Connection.fetch = fetch_then_beat
        try:
            result = await asyncio.wait_for(Evaluator(runtime.pool, settings.subjects,
                                                             settings.thresholds).evaluate(now), 60)
        finally:
            asyncpg.Connection.fetch = real_fetch
        assert result.executors_changed == 299
        assert await runtime.pool.fetchval("SELECT signal FROM health.executors WHERE executor_id = 'ex000'") is None
    finally:
        await runtime.close()
