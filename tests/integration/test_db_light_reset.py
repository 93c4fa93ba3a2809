"""A reads-only service's pool (the gateway's: libs/runtime/db.rollback_only) returns a borrowed connection
without asyncpg's reset round trip, and still rolls back a transaction a borrower left open."""

from __future__ import annotations

import pytest

from libs.runtime import db

pytestmark = pytest.mark.integration


async def released_queries(pool) -> list[str]:
    """The statements the pool sends when a connection that ran one query is returned."""
    sent: list[str] = []

    def logger(record) -> None:
        sent.append(record.query)

    async with pool.acquire() as conn:
        await conn.fetchval("SELECT 1")
        conn.add_query_logger(logger)
    async with pool.acquire() as conn:  # the same (only) connection
        conn.remove_query_logger(logger)
    return sent


async def test_a_returned_connection_costs_no_round_trip_with_the_light_reset_and_one_without(env):
    full = await db.create_pool(env.database_url, min_size=1, max_size=1)
    light = await db.create_pool(env.database_url, min_size=1, max_size=1, reset=db.rollback_only)
    try:
        assert any("UNLISTEN" in q or "RESET ALL" in q for q in await released_queries(full))
        assert await released_queries(light) == []
    finally:
        await full.close()
        await light.close()


async def test_a_transaction_left_open_is_rolled_back_when_the_connection_is_returned(env):
    pool = await db.create_pool(env.database_url, min_size=1, max_size=1, reset=db.rollback_only)
    try:
        await pool.execute("CREATE TABLE light_reset_probe (n int)")
        async with pool.acquire() as conn:
            await conn.execute("BEGIN")
            await conn.execute("INSERT INTO light_reset_probe VALUES (1)")
        async with pool.acquire() as conn:
            assert not conn.is_in_transaction()
            assert await conn.fetchval("SELECT count(*) FROM light_reset_probe") == 0
    finally:
        await pool.close()
