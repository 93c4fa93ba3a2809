"""The health service's consumers: heartbeats (batched), node registrations and job events.

Handlers decode each message with ``runtime.decode`` (a malformed one is terminated and published on
``teto.rejected.health``, never redelivered), write in one transaction per batch, and are acknowledged only
after the commit: a database failure nacks the batch with a delay, so nothing is lost and nothing spins.
"""

from __future__ import annotations

import json
import logging
from typing import TypeVar

from faststream import AckPolicy, Context
from faststream.nats import JStream, NatsRouter, PullSub
from faststream.nats.message import NatsBatchMessage
from nats.aio.msg import Msg

from libs.contracts.envelope import Envelope
from libs.contracts.jobs import JobEvent
from libs.contracts.nodes import NodeRegistered, SignalChanged
from libs.contracts.telemetry import Heartbeat
from libs.runtime.service import Runtime

from . import store

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Envelope)

RETRY_DELAY_SECONDS = 1.0


class Counters:
    """What the handlers ignored on purpose, for metrics and tests."""

    def __init__(self) -> None:
        self.stale_heartbeats = 0
        self._stale_logged: set[str] = set()

    def stale(self, beat: Heartbeat, current_epoch: int) -> None:
        self.stale_heartbeats += 1
        if beat.executor_id not in self._stale_logged:  # once per executor: a zombie beats every interval
            self._stale_logged.add(beat.executor_id)
            log.warning("ignoring heartbeats of executor %s about job %s at epoch %s (current epoch %s)",
                        beat.executor_id, beat.job_id, beat.epoch, current_epoch)


def schema_of(data: bytes) -> str | None:
    """The envelope's schema name, without validating the rest (a subject can carry several schemas)."""
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value.get("schema") if isinstance(value, dict) else None


async def decode_batch(runtime: Runtime, model: type[M], msgs: list[Msg]) -> list[M]:
    """Decode a batch; malformed messages are refused (published for operators) and terminated."""
    good = []
    for m in msgs:
        decoded = await runtime.decode(model, m.data, m.subject)
        if decoded is None:
            await m.term()
        else:
            good.append(decoded)
    return good


def batch_sub(runtime: Runtime, subject: str, stream: str, durable: str, batch_size: int = 200) -> dict:
    return dict(subject=subject, stream=JStream(runtime.subjects.stream_name(stream), declare=False),
                durable=durable, pull_sub=PullSub(batch_size=batch_size, timeout=0.2, batch=True),
                ack_policy=AckPolicy.NACK_ON_ERROR)


async def retry_later(batch: NatsBatchMessage, exc: Exception, what: str) -> None:
    log.warning("health: %s failed (%s); redelivering in %.0fs", what, exc, RETRY_DELAY_SECONDS)
    await batch.nack(delay=RETRY_DELAY_SECONDS)


def build_router(runtime: Runtime, counters: Counters) -> NatsRouter:
    router = NatsRouter()
    s = runtime.subjects

    @router.subscriber(**batch_sub(runtime, s.heartbeat_all, "HB", "health-heartbeats", batch_size=500))
    async def on_heartbeats(batch: NatsBatchMessage = Context("message")) -> None:
        beats = await decode_batch(runtime, Heartbeat, batch.raw_message)
        if not beats:
            return
        try:
            async with runtime.pool.acquire() as conn, conn.transaction():
                epochs = await store.job_epochs(conn, sorted({b.job_id for b in beats if b.job_id}))
                job_beats = []
                for b in beats:
                    current = epochs.get(b.job_id, 0) if b.job_id else 0
                    if b.job_id and (b.epoch or 0) < current:
                        counters.stale(b, current)
                    else:
                        job_beats.append(b)
                await store.record_heartbeats(conn, beats, job_beats, runtime.clock.now())
        except Exception as exc:  # noqa: BLE001 - database trouble or a bug: retry later, never lose it
            await retry_later(batch, exc, "storing heartbeats")

    @router.subscriber(**batch_sub(runtime, s.node_all, "NODE", "health-nodes"))
    async def on_node_events(batch: NatsBatchMessage = Context("message")) -> None:
        # The node stream carries other node and check events too; only registrations concern this service.
        regs = [m for m in batch.raw_message if schema_of(m.data) == NodeRegistered.SCHEMA]
        found = await decode_batch(runtime, NodeRegistered, regs)
        try:
            async with runtime.pool.acquire() as conn, conn.transaction():
                for reg in found:
                    await store.record_registration(conn, reg)
        except Exception as exc:  # noqa: BLE001 - database trouble or a bug: retry later, never lose it
            await retry_later(batch, exc, "storing registrations")

    @router.subscriber(**batch_sub(runtime, s.job_all, "JOB", "health-job-events"))
    async def on_job_events(batch: NatsBatchMessage = Context("message")) -> None:
        # Our own signal events travel on the same stream with another schema: skip them unread.
        mine = [m for m in batch.raw_message if schema_of(m.data) != SignalChanged.SCHEMA]
        events = await decode_batch(runtime, JobEvent, mine)
        try:
            async with runtime.pool.acquire() as conn, conn.transaction():
                for ev in sorted(events, key=lambda e: (e.job_id, e.seq)):
                    await store.apply_job_event(conn, ev)
        except Exception as exc:  # noqa: BLE001 - database trouble or a bug: retry later, never lose it
            await retry_later(batch, exc, "applying job events")

    return router
