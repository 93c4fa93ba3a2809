"""The budget service's consumer declarations (usage reports, legacy usage samples in heartbeats, job events,
step reports: all batched) and its status responder (core NATS request/reply in queue group ``budget``).

Each batch is one transaction whose events go through the outbox; the edge (libs/runtime/edge.py) acknowledges
it after the commit and isolates, redelivers or dead-letters what fails (redelivered samples are counted once
by the ledger's key).
"""

from __future__ import annotations

import logging

from libs.contracts.budget import BudgetStatusReply, BudgetStatusRequest
from libs.contracts.envelope import schema_of
from libs.contracts.jobs import JobEvent
from libs.contracts.nodes import SignalChanged
from libs.contracts.telemetry import Heartbeat, StepReport
from libs.contracts.usage import UsageReport
from libs.runtime import metrics, outbox
from libs.runtime.service import Runtime
from libs.runtime.unit import Units
from libs.runtime.edge import Consumer, from_sender
from libs.runtime.edge_reply import Responder
from libs.runtime.fencing import StaleCounter

from . import jobevents, orgs, store
from .grants import Admission
from .settings import BudgetSettings

log = logging.getLogger(__name__)


# How every Teto sender encodes a heartbeat without a usage sample (compact JSON, libs/contracts/envelope.py).
_NO_USAGE = b'"usage":null'


def may_carry_usage(body: bytes) -> bool:
    """Whether a heartbeat may carry a usage sample. Current agents report usage in usage reports, so nearly every
    heartbeat says ``"usage":null``: those are acknowledged unread instead of decoded (decoding them was most of
    this consumer's time). The bytes cannot occur inside a JSON string (its quotes would be escaped); a heartbeat
    encoded any other way is decoded and judged as before."""
    return _NO_USAGE not in body


class Counters:
    def __init__(self) -> None:
        self.stale = StaleCounter("budget")
        self.late = 0  # usage records of an old lease epoch, charged (the worker really ran)
        self.exhausted = 0
        self.held = 0  # usage records that came before their lease grant, held until it comes
        self.refused = 0  # usage records no lease grant allows: refused on teto.rejected.budget


def consumers(runtime: Runtime, settings: BudgetSettings, counters: Counters,
              relay: outbox.OutboxRelay | None = None) -> list[Consumer]:
    s = runtime.subjects

    # The relay is kicked after each commit: a ceiling reached tells the queue without waiting for its poll.
    units = Units(runtime.pool, store.SCHEMA, s, counters.stale, kick=relay.kick if relay is not None else None)

    def admission() -> Admission:
        return Admission(runtime.clock.now(), settings.usage_clock_slack_seconds)

    async def commit(work) -> None:
        async with units.begin() as unit:
            effects = await work(unit.conn)
            unit.emit(*effects.events)
            for stale in effects.stale:
                unit.stale(stale)
        counters.late += effects.late
        counters.held += effects.held
        counters.refused += effects.refused
        metrics.REJECTED.labels("budget").inc(effects.refused)
        exhausted = sum(1 for subj, _ in effects.events if subj.endswith(".exhausted"))
        counters.exhausted += exhausted
        # Committed: each GPU-second is counted by the replica whose transaction appended it.
        metrics.GPU_SECONDS.inc(effects.charged)
        metrics.OVERSHOOT.inc(effects.overshoot)
        metrics.BUDGET_EXHAUSTED.inc(exhausted)

    async def on_heartbeats(beats: list[Heartbeat]) -> None:
        # Agents before usage reports carried usage here; same identity, so charged once either way.
        charges = [store.charge_of(b.executor_id, b.usage) for b in beats if b.usage is not None]
        if charges:
            await commit(lambda conn: store.record_usage(conn, charges, s, admission()))

    async def on_usage(reports: list[UsageReport]) -> None:
        charges = store.charges_of(reports)
        if charges:
            await commit(lambda conn: store.record_usage(conn, charges, s, admission()))

    async def on_job_events(events: list[JobEvent]) -> None:
        await commit(lambda conn: jobevents.apply_job_events(conn, events, s, admission()))

    async def on_steps(reports: list[StepReport]) -> None:
        await commit(lambda conn: store.record_steps(conn, reports, s, runtime.clock.now()))

    return [
        # Read ahead: a batch of reports is decoded while the one before waits for its durable commit (the
        # commit's wait, not CPU, was most of a batch's time: docs/performance.md, item 3).
        Consumer(s.usage_all, "USAGE", "budget-usage-reports", None, on_usage,
                 batch=settings.usage_batch_size, read=from_sender(UsageReport.decode), read_ahead=True),
        Consumer(s.heartbeat_all, "HB", "budget-usage", None, on_heartbeats,
                 batch=settings.usage_batch_size, read=from_sender(Heartbeat.decode), accepts=may_carry_usage),
        # Health's signal events share the stream under another schema: not ours to read.
        Consumer(s.job_all, "JOB", "budget-job-events", JobEvent.decode, on_job_events,
                 accepts=lambda body: schema_of(body) != SignalChanged.SCHEMA,
                 linger_seconds=settings.batch_linger_seconds),
        # Only step reports carry step time; checkpoints and run outcomes are the queue's business.
        Consumer(s.progress_all, "PROGRESS", "budget-progress", None, on_steps, read=from_sender(StepReport.decode),
                 accepts=lambda body: schema_of(body) == StepReport.SCHEMA,
                 linger_seconds=settings.batch_linger_seconds),
    ]


def responders(runtime: Runtime, settings: BudgetSettings) -> list[Responder]:
    """Answer BudgetStatusRequest on ``teto.rpc.budget.status``; one replica of the queue group answers."""

    async def status(req: BudgetStatusRequest) -> BudgetStatusReply:
        known, ceiling, consumed = await store.status(runtime.pool, req.job_id)
        return BudgetStatusReply(job_id=req.job_id, known=known, ceiling_seconds=ceiling, consumed_seconds=consumed)

    return [Responder(runtime.subjects.rpc_budget_status, settings.rpc_queue_group, BudgetStatusRequest.decode,
                      status, lambda reason: BudgetStatusReply(job_id="", known=False)),
            orgs.responder(runtime, settings)]
