"""For tests that compare a store's batch write with the statements it replaced: a migrated service schema with
a plain connection to it, and the statements a block sends on that connection."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

import asyncpg

from libs.runtime.service import Runtime


@contextlib.asynccontextmanager
async def migrated(env, settings_cls, schema: str, package: str) -> AsyncIterator[tuple]:
    """The service's settings and a connection to its freshly migrated database (the runtime closed after)."""
    settings = env.settings(settings_cls)
    runtime = await Runtime.open(schema, settings, schema=schema, package=package)
    try:
        conn = await asyncpg.connect(env.database_url)
        try:
            yield settings, conn
        finally:
            await conn.close()
    finally:
        await runtime.close()


@contextlib.contextmanager
def statements(conn: asyncpg.Connection, about: str) -> Iterator[list[str]]:
    """The statements the block sends that name ``about`` (asyncpg's own type introspection left out)."""
    sent: list[str] = []

    def note(query) -> None:
        if about in query.query:
            sent.append(query.query)

    conn.add_query_logger(note)
    try:
        yield sent
    finally:
        conn.remove_query_logger(note)
