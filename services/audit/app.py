"""The audit service process: three batch consumers writing the hash-chained log (wiring only)."""

from __future__ import annotations

import asyncio

from libs.runtime.service import Runtime, wait_forever

from . import store
from .handlers import consumers
from .settings import AuditSettings


async def serve(settings: AuditSettings | None = None, *, ready: asyncio.Event | None = None) -> None:
    settings = settings or AuditSettings.from_env()
    runtime = await Runtime.open("audit", settings, schema=store.SCHEMA, package="services.audit")
    try:
        async with runtime.pool.acquire() as conn:
            role = await store.writer_role(conn, settings.audit_writer_role)
        # Every replica consumes from the same durables; the advisory lock in store.append keeps one chain.
        await runtime.consume(consumers(runtime, settings, role))
        if ready is not None:
            ready.set()
        await wait_forever()
    finally:
        await runtime.close()
