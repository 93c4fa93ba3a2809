"""The audit service process: three batch consumers writing the hash-chained log, the anchor loop and the verify
responder (wiring only); the consumers and the responder are the subscribers of its FastStream app
(libs/runtime/edge_stream.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from libs.runtime.gctune import tune_for_batches
from libs.runtime.service import Runtime, wait_forever
from libs.runtime.tasks import stop_tasks

from . import store
from .anchors import Anchorer, responders
from .handlers import Chain, consumers
from .keyfile import load_key
from .settings import AuditSettings

log = logging.getLogger(__name__)


async def serve(settings: AuditSettings | None = None, *, ready: asyncio.Event | None = None) -> None:
    settings = settings or AuditSettings.from_env()
    key = load_key(settings.audit_key_file) if settings.audit_key_file is not None else None
    if key is None:
        log.warning("no audit key (TETO_AUDIT_KEY_FILE): rows carry no mac, so a database superuser who rewrites "
                    "rows after the last anchor and recomputes their hashes passes verify")
    runtime = await Runtime.open("audit", settings, schema=store.SCHEMA, package="services.audit")
    anchorer = Anchorer(runtime, key)
    try:
        async with runtime.pool.acquire() as conn:
            role = await store.writer_role(conn, settings.audit_writer_role)
        # Batches of up to a thousand parsed messages (libs/runtime/gctune.py). Before the consumers start: its
        # full collection holds the event loop (30 ms in a bare process, more in a large one) and would stall the
        # first batches (docs/performance.md, the eighth round).
        tune_for_batches()
        # Every replica consumes from the same durables; the advisory lock in store.append keeps one chain.
        await runtime.provide(chain=Chain(runtime.pool, role, key), anchorer=anchorer)
        await runtime.consume(consumers(runtime.subjects, settings, runtime.clock))
        await runtime.respond(responders(runtime.subjects, settings.verify_queue_group))
        runtime.singleton("audit-anchor", lambda: anchorer.loop(settings.anchor_seconds))
        if ready is not None:
            ready.set()
        await wait_forever()
    finally:
        # The head as this replica leaves it, once its consumers stopped writing (a duplicate of another
        # replica's anchor is dropped by its message id).
        await stop_tasks(runtime.tasks)
        await runtime.stop_consuming()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(anchorer.anchor(), 5)
        await runtime.close()
