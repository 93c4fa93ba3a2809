"""The transactional outbox: events are written in the same transaction as the state they describe, and a
relay publishes them to JetStream in insertion order with their message id, a batch at a time with the
acknowledgements awaited together (``jsacks``; which rows may be in flight together: ``outbox_order``).

A crash between the commit and the publish loses nothing (the row is still unpublished); a crash between the
publish and marking the row published publishes it again with the same ``Nats-Msg-Id``, which JetStream drops
as a duplicate. So every event is published once, in order, per service. With publishes in flight together, a
failure in the middle of a wave (a connection lost, a stream unavailable) can let rows after the failed one be
stored before it is retried: never a row about the same job, executor or node (no wave holds two), so only
the order between different ones' events can change, and only after such a failure.

A row the bus can never accept (over the server's max payload, say) is quarantined with its reason instead of
being retried forever in front of every row behind it: the relay marks it, publishes a dead letter, hands it to
the service's ``on_quarantine`` hook (the queue fails the job it belonged to) and goes on with the next row.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import asyncpg
from nats.errors import MaxPayloadError
from nats.js import JetStreamContext
from nats.js.errors import APIError

from libs.contracts.dead import DeadCause, DeadLetter, dead_letter
from libs.contracts.envelope import Envelope

from .bus import trace_headers
from .jsacks import AckPipe
from .loophealth import CURRENT
from .outbox_order import waves

log = logging.getLogger(__name__)

OUTBOX_DDL = """
CREATE TABLE IF NOT EXISTS "{schema}".outbox (
    id bigserial PRIMARY KEY,
    msg_id text NOT NULL UNIQUE,
    subject text NOT NULL,
    payload bytea NOT NULL,
    headers jsonb NOT NULL DEFAULT '{{}}'::jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX IF NOT EXISTS outbox_unpublished ON "{schema}".outbox (id) WHERE published_at IS NULL;
ALTER TABLE "{schema}".outbox ADD COLUMN IF NOT EXISTS quarantined_at timestamptz;
ALTER TABLE "{schema}".outbox ADD COLUMN IF NOT EXISTS quarantine_reason text;
"""

# JetStream's "message size exceeds maximum allowed" (a stream or server limit): the same row fails every time.
_JS_PERMANENT_CODES = frozenset({10054})

QuarantineHook = Callable[[asyncpg.Connection, str, bytes, str], Awaitable[None]]
Bury = Callable[[DeadLetter], Awaitable[None]]


def unpublishable(exc: BaseException) -> bool:
    """The bus will refuse this message however often it is sent."""
    if isinstance(exc, MaxPayloadError):
        return True
    return isinstance(exc, APIError) and exc.err_code in _JS_PERMANENT_CODES


async def ensure_table(conn: asyncpg.Connection, schema: str) -> None:
    await conn.execute(OUTBOX_DDL.format(schema=schema))


OutboxRow = tuple[str, str, bytes, str]  # msg_id, subject, payload, headers (JSON)


def rows_of(items: Iterable[tuple[str, Envelope]]) -> list[OutboxRow]:
    """The outbox rows of (subject, message) pairs, with the trace context current now (the span they belong to):
    staged under one span, inserted later with others (``add_rows``), they still carry their own trace."""
    headers = json.dumps(trace_headers())  # one span for all of them: its context read once, not per message
    return [(m.id, subject, m.encode(), headers) for subject, m in items]


async def add(conn: asyncpg.Connection, schema: str, items: Iterable[tuple[str, Envelope]]) -> int:
    """Queue (subject, message) pairs for publishing; call inside the transaction that changed state."""
    return await add_rows(conn, schema, rows_of(items))


def insert_rows_sql(schema: str, first: int = 1) -> str:
    """The statement that queues rows made by ``rows_of`` in their order, its four parameters (``row_arrays``)
    numbered from ``first``: on its own (``add_rows``) or a part of a caller's one statement (queue/store.py)."""
    m, s, p, h = (f"${i}" for i in range(first, first + 4))
    return (f'INSERT INTO "{schema}".outbox (msg_id, subject, payload, headers) SELECT m, s, p, h::jsonb'
            f" FROM unnest({m}::text[], {s}::text[], {p}::bytea[], {h}::text[]) WITH ORDINALITY AS r(m, s, p, h, n)"
            " ORDER BY n ON CONFLICT (msg_id) DO NOTHING")


def row_arrays(rows: list[OutboxRow]) -> list[list[Any]]:
    """``insert_rows_sql``'s parameters: a column each."""
    return [list(c) for c in zip(*rows, strict=True)]


async def add_rows(conn: asyncpg.Connection, schema: str, rows: list[OutboxRow]) -> int:
    """Queue rows made by ``rows_of``: one statement for all of them, inserted in their order (the relay publishes
    by ``id``, drawn row after row in that order); a message id already queued is skipped, as before."""
    if rows:
        await conn.execute(insert_rows_sql(schema), *row_arrays(rows))
    return len(rows)


def _subject(row: asyncpg.Record) -> str:
    return row["subject"]


class OutboxRelay:
    """Publishes unpublished rows in id order. Run it under a SingletonLoop so one replica relays."""

    def __init__(self, pool: asyncpg.Pool, schema: str, js: JetStreamContext, *, batch: int = 500,
                 on_quarantine: QuarantineHook | None = None, bury: Bury | None = None) -> None:
        self.pool = pool
        self.schema = schema
        self.js = js
        self.batch = batch
        self.on_quarantine = on_quarantine
        self.bury = bury
        self.published = 0
        self.quarantined = 0
        self.ack_timeout = 15.0
        self.fetched = 0  # rows the last batch read
        self._pipe: AckPipe | None = None
        self._wake = asyncio.Event()

    def kick(self) -> None:
        """Tell the relay there is something new (in-process shortcut; polling covers the rest)."""
        self._wake.set()

    async def relay_once(self) -> int:
        """Publish one batch of unpublished rows in id order, a wave at a time (``outbox_order``): every row of a
        wave is sent before any acknowledgement is awaited. Rows are marked published only once acknowledged,
        also when a later one failed; the first transient failure ends the batch (raised, retried from the
        first unpublished row with the same ``Nats-Msg-Id``, so what was stored but not marked is dropped by
        JetStream as a duplicate)."""
        rows = await self.pool.fetch(
            f'SELECT id, msg_id, subject, payload, headers FROM "{self.schema}".outbox'
            " WHERE published_at IS NULL AND quarantined_at IS NULL ORDER BY id LIMIT $1",
            self.batch,
        )
        self.fetched = len(rows)
        done: list[int] = []
        try:
            for wave in waves(rows, _subject):
                await self._publish_wave(wave, done)
        finally:
            # Mark what was acknowledged even when a later publish failed, so order holds on the retry.
            if done:
                await self.pool.execute(
                    f'UPDATE "{self.schema}".outbox SET published_at = now() WHERE id = ANY($1::bigint[])', done
                )
                self.published += len(done)
        return len(done)

    async def _publish_wave(self, wave: list[asyncpg.Record], done: list[int]) -> None:
        """Send every row of the wave, then await their acknowledgements; the acknowledged rows' ids go to
        ``done``, a row the bus can never take is quarantined, and the first other failure is raised."""
        if self._pipe is None:
            self._pipe = AckPipe(self.js)
        sent: list[tuple[asyncpg.Record, dict[str, str], asyncio.Future[Any]]] = []
        failure: BaseException | None = None
        for row in wave:
            headers = json.loads(row["headers"]) if row["headers"] else {}
            headers["Nats-Msg-Id"] = row["msg_id"]
            try:
                sent.append((row, headers, await self._pipe.send(row["subject"], bytes(row["payload"]), headers)))
            except Exception as exc:
                if not unpublishable(exc):
                    failure = exc  # nothing after it is sent: its key's order holds on the retry
                    break
                await self.quarantine(row, headers, f"the bus refused it: {type(exc).__name__}: {exc}")
        outcomes = await self._pipe.settle([future for _, _, future in sent], self.ack_timeout)
        for (row, headers, _), exc in zip(sent, outcomes):
            if exc is None:
                done.append(row["id"])
            elif unpublishable(exc):
                await self.quarantine(row, headers, f"the bus refused it: {type(exc).__name__}: {exc}")
            elif failure is None:
                failure = exc
        if failure is not None:
            raise failure

    async def quarantine(self, row: asyncpg.Record, headers: dict[str, str], reason: str) -> None:
        """Set the row aside for good (with its reason), tell the service, and leave a dead letter."""
        payload = bytes(row["payload"])
        reason = f"{row['subject']}: {len(payload)} bytes: {reason}"[:4000]
        log.error("outbox %s: row %s quarantined: %s", self.schema, row["id"], reason)
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(f'UPDATE "{self.schema}".outbox SET quarantined_at = now(), quarantine_reason = $2'
                               " WHERE id = $1", row["id"], reason)
            if self.on_quarantine is not None:
                await self.on_quarantine(conn, row["subject"], payload, reason)
        self.quarantined += 1
        if self.bury is not None:
            letter = dead_letter(service=self.schema, consumer=f"{self.schema}-outbox", cause=DeadCause.UNPUBLISHABLE,
                                 reason=reason, subject=row["subject"], payload=payload, headers=headers)
            try:
                await self.bury(letter)
            except Exception as exc:  # noqa: BLE001 - the quarantine row keeps the reason and payload anyway
                log.warning("outbox %s: dead letter for row %s not published: %r", self.schema, row["id"], exc)

    async def run(self, idle_wait: float = 0.1) -> None:
        """Relay until cancelled. A batch smaller than the limit was all there was when it was read, so the relay
        then waits for a kick (or ``idle_wait``) instead of reading again at once: one statement fewer a commit.
        The kick is cleared before each read, so a commit landing after the read wakes the wait at once."""
        health, name = CURRENT.get(), f"outbox relay {self.schema}"  # a relay failing on and on: a status problem
        while True:
            self._wake.clear()
            try:
                await self.relay_once()
                more = self.fetched >= self.batch
                if health is not None:
                    health.succeeded(name)
            except (OSError, asyncpg.PostgresError, asyncio.TimeoutError, Exception) as exc:  # noqa: BLE001
                log.warning("outbox relay %s: %s; retrying", self.schema, exc)
                if health is not None:
                    health.failed(name, exc)
                more = False
                await asyncio.sleep(1.0)
            if not more:
                try:
                    await asyncio.wait_for(self._wake.wait(), idle_wait)
                except TimeoutError:
                    pass


async def purge_published(pool: asyncpg.Pool, schema: str, older_than_seconds: float = 86400.0) -> int:
    res = await pool.execute(
        f'DELETE FROM "{schema}".outbox WHERE published_at < now() - make_interval(secs => $1)', older_than_seconds
    )
    return int(res.split()[-1])
