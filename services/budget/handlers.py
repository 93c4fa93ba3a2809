"""The budget service's consumer declarations (usage reports, legacy usage samples in heartbeats, job events,
step reports: all batched) and its status responder (core NATS request/reply in queue group ``budget``).

Each batch is one transaction whose events go through the outbox; the edge (libs/runtime/edge.py) acknowledges
it after the commit and isolates, redelivers or dead-letters what fails (redelivered samples are counted once
by the ledger's key). The handlers get the ledger, the counters, the clock and the settings from the broker's
context (libs/runtime/edge_stream.py), which the app fills at start.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import asyncpg
from faststream import Context, Depends

from libs.contracts.budget import BudgetStatusReply, BudgetStatusRequest
from libs.contracts.envelope import schema_of
from libs.contracts.jobs import JobEvent
from libs.contracts.nodes import SignalChanged
from libs.contracts.telemetry import Heartbeat, StepReport
from libs.contracts.usage import UsageReport
from libs.contracts.subjects import Subjects
from libs.runtime import metrics
from libs.runtime.clock import Clock
from libs.runtime.unit import Units
from libs.runtime.edge import Consumer, from_sender
from libs.runtime.edge_reply import Responder
from libs.runtime.fencing import StaleCounter

from . import jobevents, orgs, store
from .domain.usage import Charge
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


class Ledger:
    """The budget's store as its handlers use it (``ledger`` in the broker's context): each call is one unit whose
    events go through the outbox, kicked after the commit so a ceiling reached tells the queue at once."""

    def __init__(self, units: Units, subjects: Subjects) -> None:
        self.units = units
        self.subjects = subjects

    async def record_usage(self, charges: list[Charge], admission: Admission) -> store.Effects:
        return await self._commit(lambda conn: store.record_usage(conn, charges, self.subjects, admission))

    async def apply_job_events(self, events: list[JobEvent], admission: Admission) -> store.Effects:
        return await self._commit(lambda conn: jobevents.apply_job_events(conn, events, self.subjects, admission))

    async def record_steps(self, reports: list[StepReport], now: datetime) -> store.Effects:
        return await self._commit(lambda conn: store.record_steps(conn, reports, self.subjects, now))

    async def _commit(self, work: Callable[[Any], Awaitable[store.Effects]]) -> store.Effects:
        async with self.units.begin() as unit:
            effects = await work(unit.conn)
            unit.emit(*effects.events)
            for stale in effects.stale:
                unit.stale(stale)
        return effects


def admission(clock: Clock = Context(), settings: BudgetSettings = Context()) -> Admission:
    """How usage is judged now: the budget's clock and the slack allowed between it and the queue's."""
    return Admission(clock.now(), settings.usage_clock_slack_seconds)


def count(counters: Counters, effects: store.Effects) -> None:
    """What a committed unit did, in the counters and the exported series."""
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


async def on_heartbeats(beats: list[Heartbeat], ledger: Ledger = Context(), counters: Counters = Context(),
                        admitted: Admission = Depends(admission)) -> None:
    # Agents before usage reports carried usage here; same identity, so charged once either way.
    charges = [store.charge_of(b.executor_id, b.usage) for b in beats if b.usage is not None]
    if charges:
        count(counters, await ledger.record_usage(charges, admitted))


async def on_usage(reports: list[UsageReport], ledger: Ledger = Context(), counters: Counters = Context(),
                   admitted: Admission = Depends(admission)) -> None:
    charges = store.charges_of(reports)
    if charges:
        count(counters, await ledger.record_usage(charges, admitted))


async def on_job_events(events: list[JobEvent], ledger: Ledger = Context(), counters: Counters = Context(),
                        admitted: Admission = Depends(admission)) -> None:
    count(counters, await ledger.apply_job_events(events, admitted))


async def on_steps(reports: list[StepReport], ledger: Ledger = Context(), counters: Counters = Context(),
                   clock: Clock = Context()) -> None:
    count(counters, await ledger.record_steps(reports, clock.now()))


def consumers(subjects: Subjects, settings: BudgetSettings) -> list[Consumer]:
    s = subjects
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


async def status(req: BudgetStatusRequest, pool: asyncpg.Pool = Context()) -> BudgetStatusReply:
    known, ceiling, consumed = await store.status(pool, req.job_id)
    return BudgetStatusReply(job_id=req.job_id, known=known, ceiling_seconds=ceiling, consumed_seconds=consumed)


def responders(subjects: Subjects, settings: BudgetSettings) -> list[Responder]:
    """Answer BudgetStatusRequest on ``teto.rpc.budget.status``; one replica of the queue group answers."""
    return [Responder(subjects.rpc_budget_status, settings.rpc_queue_group, BudgetStatusRequest.decode,
                      status, lambda reason: BudgetStatusReply(known=False, reason=f"malformed status request: {reason}")),
            orgs.responder(subjects, settings)]
