"""The audit service's consumer declarations: every command (``teto.cmd.>``), every outcome (``teto.outcome.>``)
and every refused message (``teto.rejected.*``), in batches, each batch one transaction acknowledged after its
commit (the edge, libs/runtime/edge.py, settles them); the next batch is read while one is being written.

Nothing is refused here: a malformed message is itself worth recording, so it is stored as raw text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from nats.aio.msg import Msg

from libs.runtime.service import Runtime
from libs.runtime.acksubject import stream_seq
from libs.runtime.edge import Consumer

from . import store
from .domain import entries
from .domain.entries import Entry
from .settings import AuditSettings

log = logging.getLogger(__name__)

Reader = Callable[[str, bytes, entries.Fallback, datetime], Entry]


def fallback_id(stream: str, msg: Msg) -> str:
    """A stable name for a message without a usable command id: its stream and sequence (same on redelivery),
    read from its ack subject (taken for every message: nats-py's ``metadata`` costs more than the rest)."""
    seq = stream_seq(msg)
    if seq is None:  # not a JetStream message (cannot happen on these consumers)
        return f"{stream}-{(msg.headers or {}).get('Nats-Msg-Id', 'unknown')}"
    return f"{stream}-{seq}"


def consumers(runtime: Runtime, settings: AuditSettings, role: str | None,
              key: bytes | None = None) -> list[Consumer]:
    s = runtime.subjects

    async def append(found: list[Entry]) -> None:
        async with runtime.pool.acquire() as conn:
            await store.append(conn, found, role=role, now=runtime.clock.now(), key=key)

    def consumer(subject: str, stream: str, durable: str, read: Reader) -> Consumer:
        def entry(m: Msg) -> Entry:
            # The fallback name only when the message has no usable id (reading it from the ack subject is a
            # split and a parse per message).
            return read(m.subject, m.data, lambda: fallback_id(stream, m), runtime.clock.now())

        # Read ahead: a batch is read (parsed, its payloads encoded) while the one before is in the database.
        return Consumer(subject, stream, durable, None, append, batch=settings.batch_size, read=entry,
                        read_ahead=True, linger_seconds=settings.batch_linger_seconds)

    return [
        consumer(s.cmd_all, "CMD", "audit-commands", entries.from_command),
        consumer(s.outcome_all, "OUTCOME", "audit-outcomes", entries.from_outcome),
        consumer(s.rejected_all, "REJECTED", "audit-rejected", entries.from_rejected),
    ]

