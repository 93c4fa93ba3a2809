"""The audit service process: three batch consumers writing the hash-chained log (wiring only)."""

from __future__ import annotations

import asyncio
import logging

from faststream.nats import NatsBroker

from libs.runtime.service import Runtime, wait_forever

from . import store
from .handlers import build_router
from .settings import AuditSettings


async def serve(settings: AuditSettings | None = None, *, ready: asyncio.Event | None = None) -> None:
    settings = settings or AuditSettings.from_env()
    runtime = await Runtime.open("audit", settings, schema=store.SCHEMA, package="services.audit")
    broker = NatsBroker(settings.nats_url, log_level=logging.DEBUG)
    try:
        async with runtime.pool.acquire() as conn:
            role = await store.writer_role(conn, settings.writer_role)
        broker.include_router(build_router(runtime, settings, role))
        await broker.start()
        if ready is not None:
            ready.set()
        await wait_forever()
    finally:
        await broker.stop()
        await runtime.close()
