"""The audit service's consumers: every command (``teto.cmd.>``), every outcome (``teto.outcome.>``) and every
refused message (``teto.rejected.*``), in batches, each batch one transaction acknowledged after its commit.

Nothing is refused here: a malformed message is itself worth recording, so it is stored as raw text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from nats.aio.msg import Msg

from libs.runtime.service import Runtime
from libs.runtime.batch import BatchConsumer

from . import store
from .domain import entries
from .domain.entries import Entry
from .settings import AuditSettings

log = logging.getLogger(__name__)

Reader = Callable[[str, bytes, str, datetime], Entry]


def fallback_id(stream: str, msg: Msg) -> str:
    """A stable name for a message without a usable command id: its stream and sequence (same on redelivery)."""
    try:
        return f"{stream}-{msg.metadata.sequence.stream}"
    except Exception:  # noqa: BLE001 - not a JetStream message (cannot happen on these consumers)
        return f"{stream}-{(msg.headers or {}).get('Nats-Msg-Id', 'unknown')}"


def consumers(runtime: Runtime, settings: AuditSettings, role: str | None) -> list[BatchConsumer]:
    s = runtime.subjects

    def consumer(subject: str, stream: str, durable: str, read: Reader) -> BatchConsumer:
        async def on_batch(msgs: list[Msg]) -> None:
            now = runtime.clock.now()
            found = [read(m.subject, m.data, fallback_id(stream, m), now) for m in msgs]
            async with runtime.pool.acquire() as conn:
                await store.append(conn, found, role=role, now=now)

        return BatchConsumer(runtime.js, subject, s.stream_name(stream), durable, on_batch, batch=settings.batch_size)

    return [
        consumer(s.cmd_all, "CMD", "audit-commands", entries.from_command),
        consumer(s.outcome_all, "OUTCOME", "audit-outcomes", entries.from_outcome),
        consumer(s.rejected_all, "REJECTED", "audit-rejected", entries.from_rejected),
    ]
