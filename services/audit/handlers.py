"""The audit service's consumers: every command (``teto.cmd.>``), every outcome (``teto.outcome.>``) and every
refused message (``teto.rejected.*``), in batches, each batch one transaction acknowledged after its commit.

Nothing is refused here: a malformed message is itself worth recording, so it is stored as raw text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from faststream import AckPolicy, Context
from faststream.nats import JStream, NatsRouter, PullSub
from faststream.nats.message import NatsBatchMessage
from nats.aio.msg import Msg

from libs.runtime.service import Runtime

from . import store
from .domain import entries
from .domain.entries import Entry
from .settings import AuditSettings

log = logging.getLogger(__name__)
RETRY_DELAY_SECONDS = 1.0

Reader = Callable[[str, bytes, str, datetime], Entry]


def fallback_id(stream: str, msg: Msg) -> str:
    """A stable name for a message without a usable command id: its stream and sequence (same on redelivery)."""
    try:
        return f"{stream}-{msg.metadata.sequence.stream}"
    except Exception:  # noqa: BLE001 - not a JetStream message (cannot happen on these consumers)
        return f"{stream}-{(msg.headers or {}).get('Nats-Msg-Id', 'unknown')}"


def build_router(runtime: Runtime, settings: AuditSettings, role: str | None) -> NatsRouter:
    router = NatsRouter()
    s = runtime.subjects

    def consumer(subject: str, stream: str, durable: str, read: Reader) -> None:
        @router.subscriber(subject, stream=JStream(s.stream_name(stream), declare=False), durable=durable,
                           pull_sub=PullSub(batch_size=settings.batch_size, timeout=0.2, batch=True),
                           ack_policy=AckPolicy.NACK_ON_ERROR)
        async def on_batch(batch: NatsBatchMessage = Context("message")) -> None:
            now = runtime.clock.now()
            found = [read(m.subject, m.data, fallback_id(stream, m), now) for m in batch.raw_message]
            try:
                async with runtime.pool.acquire() as conn:
                    await store.append(conn, found, role=role, now=now)
            except Exception as exc:  # noqa: BLE001 - database trouble or a bug: nothing is acknowledged
                log.warning("audit: storing %d messages from %s failed (%r); redelivering in %.0fs",
                            len(found), stream, exc, RETRY_DELAY_SECONDS)
                await batch.nack(delay=RETRY_DELAY_SECONDS)

    consumer(s.cmd_all, "CMD", "audit-commands", entries.from_command)
    consumer(s.outcome_all, "OUTCOME", "audit-outcomes", entries.from_outcome)
    consumer(s.rejected_all, "REJECTED", "audit-rejected", entries.from_rejected)
    return router
