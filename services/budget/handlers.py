"""The budget service's consumers (usage samples in heartbeats, job events, step reports: all batched) and
its status responder (core NATS request/reply in queue group ``budget``).

Each batch is one transaction whose events go through the outbox; the batch is acknowledged only after the
commit, and a failure nacks it with a delay (redelivered samples are counted once by the ledger's key).
"""

from __future__ import annotations

import json
import logging
from typing import TypeVar

from faststream import AckPolicy, Context
from faststream.nats import JStream, NatsRouter, PullSub
from faststream.nats.message import NatsBatchMessage
from nats.aio.msg import Msg

from libs.contracts.budget import BudgetStatusReply, BudgetStatusRequest
from libs.contracts.envelope import Envelope
from libs.contracts.jobs import JobEvent
from libs.contracts.nodes import SignalChanged
from libs.contracts.telemetry import Heartbeat, StepReport
from libs.runtime import outbox
from libs.runtime.service import Runtime

from . import store
from .settings import BudgetSettings

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Envelope)
RETRY_DELAY_SECONDS = 1.0


class Counters:
    def __init__(self) -> None:
        self.stale = 0
        self.exhausted = 0
        self._logged: set[str] = set()

    def ignore_stale(self, executor_id: str, job_id: str, epoch: int) -> None:
        self.stale += 1
        if executor_id not in self._logged:  # once per executor: a zombie reports every interval
            self._logged.add(executor_id)
            log.warning("ignoring reports of executor %s about job %s at old epoch %s", executor_id, job_id, epoch)


def schema_of(data: bytes) -> str | None:
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value.get("schema") if isinstance(value, dict) else None


async def decode_batch(runtime: Runtime, model: type[M], msgs: list[Msg]) -> list[M]:
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


def build_router(runtime: Runtime, settings: BudgetSettings, counters: Counters,
                 relay: outbox.OutboxRelay | None = None) -> NatsRouter:
    router = NatsRouter()
    s = runtime.subjects

    async def commit(batch: NatsBatchMessage, what: str, work) -> None:
        try:
            async with runtime.pool.acquire() as conn, conn.transaction():
                effects = await work(conn)
                await outbox.add(conn, store.SCHEMA, effects.events)
        except Exception as exc:  # noqa: BLE001 - database trouble or a bug: retry later, never lose it
            log.warning("budget: %s failed (%r); redelivering in %.0fs", what, exc, RETRY_DELAY_SECONDS)
            await batch.nack(delay=RETRY_DELAY_SECONDS)
            return
        for item in effects.stale:
            executor_id, sample = item if isinstance(item, tuple) else (item.executor_id, item)
            counters.ignore_stale(executor_id, sample.job_id, sample.epoch)
        counters.exhausted += sum(1 for subj, _ in effects.events if subj.endswith(".exhausted"))
        if effects.events and relay is not None:
            relay.kick()  # the ceiling is reached: tell the queue without waiting for the relay's poll

    @router.subscriber(**batch_sub(runtime, s.heartbeat_all, "HB", "budget-usage", settings.usage_batch_size))
    async def on_heartbeats(batch: NatsBatchMessage = Context("message")) -> None:
        beats = await decode_batch(runtime, Heartbeat, batch.raw_message)
        samples = [(b.executor_id, b.usage) for b in beats if b.usage is not None]
        if samples:
            await commit(batch, "recording usage", lambda conn: store.record_usage(conn, samples, s))

    @router.subscriber(**batch_sub(runtime, s.job_all, "JOB", "budget-job-events"))
    async def on_job_events(batch: NatsBatchMessage = Context("message")) -> None:
        # Health's signal events share the stream under another schema: not ours to read.
        events = await decode_batch(runtime, JobEvent,
                                    [m for m in batch.raw_message if schema_of(m.data) != SignalChanged.SCHEMA])
        if not events:
            return

        async def work(conn):
            total = store.Effects()
            for ev in sorted(events, key=lambda e: (e.job_id, e.seq)):
                one = await store.apply_job_event(conn, ev, s)
                total.events += one.events
            return total

        await commit(batch, "applying job events", work)

    @router.subscriber(**batch_sub(runtime, s.progress_all, "PROGRESS", "budget-progress"))
    async def on_progress(batch: NatsBatchMessage = Context("message")) -> None:
        # Only step reports carry step time; checkpoints and run outcomes are the queue's business.
        steps = [m for m in batch.raw_message if schema_of(m.data) == StepReport.SCHEMA]
        reports = await decode_batch(runtime, StepReport, steps)
        if reports:
            await commit(batch, "recording steps",
                         lambda conn: store.record_steps(conn, reports, s, runtime.clock.now()))

    return router


async def serve_status(runtime: Runtime, settings: BudgetSettings) -> None:
    """Answer BudgetStatusRequest on ``teto.rpc.budget.status``; one replica of the queue group answers."""

    async def on_request(msg: Msg) -> None:
        req = await runtime.decode(BudgetStatusRequest, msg.data, msg.subject)
        if req is None:
            reply = BudgetStatusReply(job_id="", known=False)
        else:
            known, ceiling, consumed = await store.status(runtime.pool, req.job_id)
            reply = BudgetStatusReply(job_id=req.job_id, known=known, ceiling_seconds=ceiling,
                                      consumed_seconds=consumed)
        if msg.reply:
            await msg.respond(reply.encode())

    await runtime.nc.subscribe(runtime.subjects.rpc_budget_status, queue=settings.rpc_queue_group, cb=on_request)
