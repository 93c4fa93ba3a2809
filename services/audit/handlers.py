"""The audit service's consumer declarations: every command (``teto.cmd.>``), every outcome (``teto.outcome.>``)
and every refused message (``teto.rejected.*``), in batches, each batch one transaction acknowledged after its
commit (the edge, libs/runtime/edge.py, settles them); the next batch is read while one is being written. The
handler gets the chain it appends to and the clock from the broker's context (``chain``, ``clock``:
libs/runtime/edge_stream.py).

Nothing is refused here: a malformed message is itself worth recording, so it is stored as raw text.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import asyncpg
from faststream import Context
from nats.aio.msg import Msg

from libs.contracts.subjects import Subjects
from libs.runtime.acksubject import stream_seq
from libs.runtime.clock import Clock
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


@dataclass(frozen=True)
class Chain:
    """Where the handlers append: the hash-chained log (``store.append``), written as the audit writer ``role``,
    each row with its mac when there is a ``key``. The handlers find it in the broker's context as ``chain``."""

    pool: asyncpg.Pool
    role: str | None
    key: bytes | None = None

    async def append(self, found: list[Entry], now: datetime) -> int:
        async with self.pool.acquire() as conn:
            return await store.append(conn, found, role=self.role, now=now, key=self.key)


async def append(found: list[Entry], chain: Chain = Context(), clock: Clock = Context()) -> None:
    """A batch of entries, in stream order, in one transaction (the chain's lock and one COPY)."""
    await chain.append(found, clock.now())


def consumers(subjects: Subjects, settings: AuditSettings, clock: Clock) -> list[Consumer]:
    """``clock`` stamps what a message does not say itself (when it came, for a message without a time) as each
    batch is read, before its handler (the reader is the edge's, per message: not injected)."""
    s = subjects

    def consumer(subject: str, stream: str, durable: str, read: Reader) -> Consumer:
        def entry(m: Msg) -> Entry:
            # The fallback name only when the message has no usable id (reading it from the ack subject is a
            # split and a parse per message).
            return read(m.subject, m.data, lambda: fallback_id(stream, m), clock.now())

        # Read ahead: a batch is read (parsed, its payloads encoded) while the one before is in the database.
        return Consumer(subject, stream, durable, None, append, batch=settings.batch_size, read=entry,
                        read_ahead=True, linger_seconds=settings.batch_linger_seconds)

    return [
        consumer(s.cmd_all, "CMD", "audit-commands", entries.from_command),
        consumer(s.outcome_all, "OUTCOME", "audit-outcomes", entries.from_outcome),
        consumer(s.rejected_all, "REJECTED", "audit-rejected", entries.from_rejected),
    ]
