"""The budget service's consumers (usage reports, legacy usage samples in heartbeats, job events, step
reports: all batched) and its status responder (core NATS request/reply in queue group ``budget``).

Each batch is one transaction whose events go through the outbox; the batch is acknowledged only after the
commit, and a failure redelivers it (redelivered samples are counted once by the ledger's key).
"""

from __future__ import annotations

import logging

from nats.aio.msg import Msg

from libs.contracts.budget import BudgetStatusReply, BudgetStatusRequest
from libs.contracts.envelope import schema_of
from libs.contracts.jobs import JobEvent
from libs.contracts.nodes import SignalChanged
from libs.contracts.telemetry import Heartbeat, StepReport
from libs.contracts.usage import UsageReport
from libs.runtime import outbox
from libs.runtime.service import Runtime
from libs.runtime.batch import BatchConsumer

from . import store
from .settings import BudgetSettings

log = logging.getLogger(__name__)


class Counters:
    def __init__(self) -> None:
        self.stale = 0
        self.late = 0  # usage records of an old lease epoch, charged (the worker really ran)
        self.exhausted = 0
        self._logged: set[str] = set()

    def ignore_stale(self, executor_id: str, job_id: str, epoch: int) -> None:
        self.stale += 1
        if executor_id not in self._logged:  # once per executor: a zombie reports every interval
            self._logged.add(executor_id)
            log.warning("ignoring reports of executor %s about job %s at old epoch %s", executor_id, job_id, epoch)


def consumers(runtime: Runtime, settings: BudgetSettings, counters: Counters,
              relay: outbox.OutboxRelay | None = None) -> list[BatchConsumer]:
    s = runtime.subjects

    async def commit(work) -> None:
        async with runtime.pool.acquire() as conn, conn.transaction():
            effects = await work(conn)
            await outbox.add(conn, store.SCHEMA, effects.events)
        for item in effects.stale:
            executor_id, sample = item if isinstance(item, tuple) else (item.executor_id, item)
            counters.ignore_stale(executor_id, sample.job_id, sample.epoch)
        counters.late += effects.late
        counters.exhausted += sum(1 for subj, _ in effects.events if subj.endswith(".exhausted"))
        if effects.events and relay is not None:
            relay.kick()  # the ceiling is reached: tell the queue without waiting for the relay's poll

    async def on_heartbeats(msgs: list[Msg]) -> None:
        beats = await runtime.decode_batch(Heartbeat, msgs)
        # Agents before usage reports carried usage here; same identity, so charged once either way.
        charges = [store.charge_of(b.executor_id, b.usage) for b in beats if b.usage is not None]
        if charges:
            await commit(lambda conn: store.record_usage(conn, charges, s))

    async def on_usage(msgs: list[Msg]) -> None:
        charges = store.charges_of(await runtime.decode_batch(UsageReport, msgs))
        if charges:
            await commit(lambda conn: store.record_usage(conn, charges, s))

    async def on_job_events(msgs: list[Msg]) -> None:
        # Health's signal events share the stream under another schema: not ours to read.
        events = await runtime.decode_batch(JobEvent, [m for m in msgs if schema_of(m.data) != SignalChanged.SCHEMA])
        if not events:
            return

        async def work(conn):
            total = store.Effects()
            for ev in sorted(events, key=lambda e: (e.job_id, e.seq)):
                total.events += (await store.apply_job_event(conn, ev, s)).events
            return total

        await commit(work)

    async def on_progress(msgs: list[Msg]) -> None:
        # Only step reports carry step time; checkpoints and run outcomes are the queue's business.
        reports = await runtime.decode_batch(StepReport, [m for m in msgs if schema_of(m.data) == StepReport.SCHEMA])
        if reports:
            await commit(lambda conn: store.record_steps(conn, reports, s, runtime.clock.now()))

    def consumer(subject: str, stream: str, durable: str, handle, batch: int = 200) -> BatchConsumer:
        return BatchConsumer(runtime.js, subject, s.stream_name(stream), durable, handle, batch=batch)

    return [
        consumer(s.usage_all, "USAGE", "budget-usage-reports", on_usage, batch=settings.usage_batch_size),
        consumer(s.heartbeat_all, "HB", "budget-usage", on_heartbeats, batch=settings.usage_batch_size),
        consumer(s.job_all, "JOB", "budget-job-events", on_job_events),
        consumer(s.progress_all, "PROGRESS", "budget-progress", on_progress),
    ]


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
