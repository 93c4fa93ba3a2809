"""A service's pool (every service's: libs/runtime/db.rollback_only, set by Runtime.open) returns a borrowed
connection without asyncpg's reset round trip, still rolls back a transaction a borrower left open, and the one
borrower that takes session state (``db.migrate``: a session advisory lock, SET ROLE) gives it back itself."""

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


async def test_migrating_leaves_no_session_lock_or_role_on_a_pooled_connection(env):
    """What asyncpg's full reset would have undone (``pg_advisory_unlock_all``, ``RESET ALL``) is undone by
    ``db.migrate`` itself, so the light reset is safe for the pools that migrate."""
    pool = await db.create_pool(env.database_url, min_size=1, max_size=1, reset=db.rollback_only)
    try:
        login = await pool.fetchval("SELECT current_user")
        await pool.execute("CREATE ROLE light_reset_owner")
        await pool.execute(f'GRANT light_reset_owner TO "{login}"')
        await pool.execute(f'GRANT CREATE ON DATABASE "{await pool.fetchval("SELECT current_database()")}" '
                           "TO light_reset_owner")
        assert await db.migrate(pool, "lr", "libs.runtime", as_role="light_reset_owner") == []
        async with pool.acquire() as conn:  # the same (only) connection the migration used
            assert await conn.fetchval("SELECT current_user") == login
            assert await conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()") == 0
            assert await conn.fetchval("SELECT count(*) FROM pg_namespace WHERE nspname = 'lr'") == 1
    finally:
        await pool.close()
