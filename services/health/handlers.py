"""The health service's consumer declarations: heartbeats, node registrations, check reports, fleet commands
and job events, each in batches of one transaction. Malformed, failing and poison messages are the edge's
business (libs/runtime/edge.py): refused visibly, isolated, redelivered with back-off or dead-lettered. The
handlers get what they use (the heartbeat log, the pool, the clock, the checks, the reporter) from the broker's
context (libs/runtime/edge_stream.py), which the app fills at start.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime

import asyncpg
from faststream import Context

from libs.contracts.commands import ClearGroupAlert, DrainNode, RunHealthCheck, UndrainNode
from libs.contracts.envelope import schema_of
from libs.contracts.jobs import JobEvent
from libs.contracts.nodes import CheckReport, NodeRegistered, SignalChanged
from libs.contracts.telemetry import Heartbeat
from libs.contracts import senders
from libs.contracts.subjects import Subjects
from libs.runtime import metrics
from libs.runtime.clock import Clock
from libs.runtime.edge import Consumer, Reporter, from_sender
from libs.runtime.fencing import StaleCounter, StaleEpoch
from libs.runtime.unit import Unit, Units
from libs.runtime.wake import channel, notify

from . import registrations, store
from .checks import Checks
from .domain.observed import results_of
from .settings import HealthSettings

log = logging.getLogger(__name__)


class Counters:
    """What the handlers ignored on purpose, for metrics and tests."""

    def __init__(self) -> None:
        self.stale = StaleCounter("health")

    @property
    def stale_heartbeats(self) -> int:
        return self.stale.count


def _registration(m) -> NodeRegistered:
    """A registration is refused unless its body names the node its subject does (the sender's own node)."""
    return senders.registration(NodeRegistered.decode)(m.subject, m.data)


@dataclass
class HeartbeatUnit:
    """One heartbeat batch's transaction as the handler sees it (what ``HeartbeatLog.begin`` yields)."""

    unit: Unit
    evaluator: str  # the channel that wakes the signal evaluator

    async def job_epochs(self, job_ids: list[str]) -> dict[str, int]:
        return await store.job_epochs(self.unit.conn, job_ids)

    def stale(self, fact: StaleEpoch) -> None:
        self.unit.stale(fact)  # counted against its sender once committed

    async def record(self, beats: list[Heartbeat], job_beats: list[Heartbeat], now: datetime) -> None:
        await store.record_heartbeats(self.unit.conn, beats, job_beats, now)

    async def note_stale(self, stale: list[StaleEpoch], now: datetime) -> None:
        await store.note_stale(self.unit.conn, stale, now)

    async def wake_evaluator(self) -> None:
        await notify(self.unit.conn, self.evaluator)  # delivered at the commit: the evaluator sees the batch


class HeartbeatLog:
    """Where heartbeats are stored (``heartbeats`` in the broker's context): a unit per batch."""

    def __init__(self, units: Units, subjects: Subjects) -> None:
        self.units = units
        self.evaluator = channel(subjects.prefix, store.EVALUATOR)

    @contextlib.asynccontextmanager
    async def begin(self) -> AsyncIterator[HeartbeatUnit]:
        async with self.units.begin() as unit:
            yield HeartbeatUnit(unit, self.evaluator)


async def on_heartbeats(beats: list[Heartbeat], heartbeats: HeartbeatLog = Context(),
                        clock: Clock = Context()) -> None:
    async with heartbeats.begin() as tx:
        epochs = await tx.job_epochs(sorted({b.job_id for b in beats if b.job_id}))
        job_beats, stale = store.split_stale(beats, epochs)
        for fact in stale:
            tx.stale(fact)
        now = clock.now()
        await tx.record(beats, job_beats, now)
        if stale:
            await tx.note_stale(stale, now)
        await tx.wake_evaluator()  # the evaluator judges them once they are committed


async def on_registrations(regs: list[NodeRegistered], pool: asyncpg.Pool = Context(), clock: Clock = Context(),
                           checks: Checks = Context(), reporter: Reporter = Context(),
                           subjects: Subjects = Context()) -> None:
    async with pool.acquire() as conn, conn.transaction():
        regs, foreign = await registrations.split_foreign(conn, regs, clock.now(), checks.settings.node_gone_seconds)
        for reg in regs:
            await checks.on_registration(conn, reg)
        # The executors last, in key order (as heartbeats and the evaluator lock them): a node's lock waited
        # for above (the check loop holds joining nodes) never holds up their heartbeats (issue 12).
        await store.record_registrations(conn, regs)
    for reg, reason in foreign:  # visibly, like a malformed one (teto.rejected.health, then the audit log)
        await reporter.reject(subjects.node(reg.node_id, "registered"), reg.encode(), reason)


async def on_check_reports(reports: list[CheckReport], pool: asyncpg.Pool = Context(),
                           checks: Checks = Context()) -> None:
    provision = []
    async with pool.acquire() as conn, conn.transaction():
        for rep in sorted(reports, key=lambda r: r.time):
            provision += await checks.on_report(conn, rep)
    checks.kick()
    for result in results_of(reports):  # committed: the node's results and latest figures
        metrics.CHECK_RESULTS.labels(result.node_id, result.test, result.status).inc()
        for name, value in result.figures:
            metrics.CHECK_FIGURE.labels(result.node_id, result.test, name).set(value)
    for request in provision:  # after the commit: the node is replaced whatever the hook does
        await checks.provision(request)


async def on_commands(cmds: list[RunHealthCheck | DrainNode | UndrainNode | ClearGroupAlert],
                      checks: Checks = Context()) -> None:
    for cmd in cmds:
        await checks.on_command(cmd)


async def on_job_events(events: list[JobEvent], pool: asyncpg.Pool = Context()) -> None:
    async with pool.acquire() as conn:  # one transaction, opened by the store when it takes two
        await store.apply_job_events(conn, events)


def consumers(subjects: Subjects, settings: HealthSettings) -> list[Consumer]:
    s = subjects
    return [
        Consumer(s.heartbeat_all, "HB", "health-heartbeats", None, on_heartbeats, batch=500,
                 read=from_sender(Heartbeat.decode)),
        # The node stream carries other node and check events too; only registrations concern this service.
        Consumer(s.node_all, "NODE", "health-nodes", None, on_registrations, read=_registration,
                 accepts=lambda body: schema_of(body) == NodeRegistered.SCHEMA),
        # Our own signal events travel on the job stream under another schema: skipped unread.
        Consumer(s.job_all, "JOB", "health-job-events", JobEvent.decode, on_job_events,
                 accepts=lambda body: schema_of(body) != SignalChanged.SCHEMA,
                 linger_seconds=settings.batch_linger_seconds),
        Consumer(s.check_all, "NODE", "health-check-reports", None, on_check_reports, batch=50,
                 read=from_sender(CheckReport.decode)),
        *(Consumer(s.cmd(m.KIND), "CMD", f"health-{m.KIND}", m.decode, on_commands, batch=10)
          for m in (RunHealthCheck, DrainNode, UndrainNode, ClearGroupAlert)),
    ]
