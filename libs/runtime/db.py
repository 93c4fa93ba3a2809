"""PostgreSQL at the edges: pools, and versioned migrations per service schema.

Each service owns one schema and its migrations (``services/<name>/migrations/NNN_title.sql``), applied in
order under an advisory lock so replicas starting together apply each exactly once.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.resources
import logging
import re
from collections.abc import Awaitable, Callable

import asyncpg

from .dbroles import share_public_views
from .outbox import OUTBOX_DDL

log = logging.getLogger(__name__)

_MIGRATION = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")


async def rollback_only(conn: asyncpg.Connection) -> None:
    """A pool's reset for connections whose users keep no session state (every service's pool:
    ``Runtime.open``): they never LISTEN, SET outside a transaction, hold session advisory locks or keep cursors
    past their use. asyncpg's own reset sends ``pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *;
    RESET ALL`` on every release, a round trip per borrowed connection; this one sends nothing unless the
    borrower left a transaction open, which it rolls back."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10, attempts: int = 60,
                      reset: Callable[[asyncpg.Connection], Awaitable[None]] | None = None) -> asyncpg.Pool:
    """``reset``: what a connection goes through when it is returned (None: asyncpg's full reset)."""
    last: Exception | None = None
    for _ in range(attempts):
        try:
            return await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, command_timeout=60,
                                             reset=reset)
        except (OSError, asyncpg.PostgresError) as exc:
            last = exc
            await asyncio.sleep(0.5)
    raise ConnectionError(f"cannot connect to PostgreSQL: {last}")


async def close_pool(pool: asyncpg.Pool, *, timeout: float = 10.0) -> bool:
    """Close ``pool`` gracefully, waiting at most ``timeout`` seconds for its borrowed connections to come back, then
    terminate it (asyncpg's ``close`` waits for ever on a connection that is never released: a shutdown that never
    ends). True when it closed gracefully."""
    try:
        await asyncio.wait_for(pool.close(), timeout)  # a close cancelled at the bound terminates the pool itself
        return True
    except (asyncio.TimeoutError, OSError, asyncpg.PostgresError) as exc:
        held = pool.get_size() - pool.get_idle_size()
        log.warning("PostgreSQL pool not closed within %gs (%d connection(s) still borrowed, %r): terminated",
                    timeout, held, exc)
        pool.terminate()
        return False


def lock_key(name: str) -> int:
    """A stable signed 64-bit advisory-lock key for a name."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def migrations_of(package: str) -> list[tuple[int, str, str]]:
    """(version, title, sql) of a package's ``migrations`` folder, in order."""
    root = importlib.resources.files(package).joinpath("migrations")
    found: list[tuple[int, str, str]] = []
    if not root.is_dir():
        return found
    for entry in root.iterdir():
        m = _MIGRATION.match(entry.name)
        if m:
            found.append((int(m.group(1)), m.group(2), entry.read_text()))
    found.sort()
    versions = [v for v, _, _ in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"duplicate migration versions in {package}: {versions}")
    return found


class MigrationsPending(RuntimeError):
    """This login may not migrate its schema (it does not own it) and the administrator has not yet applied
    every migration this code needs."""

    def __init__(self, schema: str, pending: list[int], user: str) -> None:
        super().__init__(f"schema {schema}: migrations {pending} are not applied and {user} may not apply them "
                         "(it does not own the schema): run `teto up`, or the administrator's migration step")
        self.schema, self.pending, self.user = schema, pending, user


async def may_migrate(conn: asyncpg.Connection, schema: str) -> bool:
    """The session acts as the schema's owner (or may create it): a login that owns nothing only checks."""
    owner = await conn.fetchval("SELECT nspowner FROM pg_namespace WHERE nspname = $1", schema)
    if owner is None:
        return bool(await conn.fetchval(
            "SELECT has_database_privilege(current_user, current_database(), 'CREATE')"))
    return bool(await conn.fetchval("SELECT pg_has_role(current_user, $1::oid, 'USAGE')", owner))


async def pending_migrations(conn: asyncpg.Connection, schema: str, package: str) -> list[int]:
    """The package's migration versions not recorded in the schema (all of them if it has no record)."""
    wanted = [v for v, _, _ in migrations_of(package)]
    try:
        done = {r["version"] for r in await conn.fetch(f'SELECT version FROM "{schema}".schema_migrations')}
    except (asyncpg.UndefinedTableError, asyncpg.InvalidSchemaNameError):
        return wanted
    return [v for v in wanted if v not in done]


async def migrate(pool: asyncpg.Pool, schema: str, package: str, *, as_role: str | None = None) -> list[int]:
    """Apply the package's pending migrations into ``schema``; returns the versions applied now.

    ``as_role``: the administrator migrates as the schema's owner role (SET ROLE), so what the migrations create
    belongs to that role. A login that does not own the schema (the audit service, the gateway) applies nothing:
    it checks that everything is applied and raises MigrationsPending otherwise.
    """
    async with pool.acquire() as conn:
        if as_role:
            await conn.execute(f'SET ROLE "{as_role}"')
        try:
            if not await may_migrate(conn, schema):
                pending = await pending_migrations(conn, schema, package)
                if pending:
                    raise MigrationsPending(schema, pending, await conn.fetchval("SELECT current_user"))
                return []
            return await _apply(conn, schema, package)
        finally:
            if as_role:
                await conn.execute("RESET ROLE")


async def _apply(conn: asyncpg.Connection, schema: str, package: str) -> list[int]:
    applied_now: list[int] = []
    await conn.execute("SELECT pg_advisory_lock($1)", lock_key(f"migrate:{schema}"))
    try:
        # CREATE SCHEMA checks the right to create in the database before IF NOT EXISTS: an owner that may
        # not create schemas must not even ask.
        if not await conn.fetchval("SELECT 1 FROM pg_namespace WHERE nspname = $1", schema):
            await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await conn.execute(OUTBOX_DDL.format(schema=schema))
        await conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{schema}".schema_migrations ('
            " version int PRIMARY KEY, title text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"] for r in await conn.fetch(f'SELECT version FROM "{schema}".schema_migrations')}
        for version, title, sql in migrations_of(package):
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(f'SET LOCAL search_path TO "{schema}", public')
                await conn.execute(sql)
                await conn.execute(
                    f'INSERT INTO "{schema}".schema_migrations (version, title) VALUES ($1, $2)', version, title
                )
            log.info("migrated %s to %03d_%s", schema, version, title)
            applied_now.append(version)
        if applied_now:
            await share_public_views(conn, schema)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", lock_key(f"migrate:{schema}"))
    return applied_now
