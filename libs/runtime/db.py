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

import asyncpg

from .outbox import OUTBOX_DDL

log = logging.getLogger(__name__)

_MIGRATION = re.compile(r"^(\d{3})_([a-z0-9_]+)\.sql$")


async def create_pool(dsn: str, *, min_size: int = 1, max_size: int = 10, attempts: int = 60) -> asyncpg.Pool:
    last: Exception | None = None
    for _ in range(attempts):
        try:
            return await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, command_timeout=60)
        except (OSError, asyncpg.PostgresError) as exc:
            last = exc
            await asyncio.sleep(0.5)
    raise ConnectionError(f"cannot connect to PostgreSQL: {last}")


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


async def migrate(pool: asyncpg.Pool, schema: str, package: str) -> list[int]:
    """Apply the package's pending migrations into ``schema``; returns the versions applied now."""
    applied_now: list[int] = []
    async with pool.acquire() as conn:
        await conn.execute("SELECT pg_advisory_lock($1)", lock_key(f"migrate:{schema}"))
        try:
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
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", lock_key(f"migrate:{schema}"))
    return applied_now
