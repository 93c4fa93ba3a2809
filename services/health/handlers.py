"""The health service's consumers: heartbeats, node registrations and job events, each in batches.

Handlers decode each message with ``runtime.decode`` (a malformed one is terminated and published on
``teto.rejected.health``, never redelivered) and write one transaction per batch; the batch is acknowledged
only after the commit, and a failure redelivers it (see batching.py).
"""

from __future__ import annotations

import logging

from nats.aio.msg import Msg

from libs.contracts.envelope import schema_of
from libs.contracts.jobs import JobEvent
from libs.contracts.commands import ClearGroupAlert, DrainNode, RunHealthCheck, UndrainNode
from libs.contracts.nodes import CheckReport, NodeRegistered, SignalChanged
from libs.contracts.telemetry import Heartbeat
from libs.runtime.service import Runtime

from . import store
from .checks import Checks
from libs.runtime.batch import BatchConsumer

log = logging.getLogger(__name__)


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


def consumers(runtime: Runtime, counters: Counters, checks: Checks) -> list[BatchConsumer]:
    s = runtime.subjects

    async def on_heartbeats(msgs: list[Msg]) -> None:
        beats = await runtime.decode_batch(Heartbeat, msgs)
        if not beats:
            return
        async with runtime.pool.acquire() as conn, conn.transaction():
            epochs = await store.job_epochs(conn, sorted({b.job_id for b in beats if b.job_id}))
            job_beats, stale = [], []
            for b in beats:
                current = epochs.get(b.job_id, 0) if b.job_id else 0
                if b.job_id and (b.epoch or 0) < current:
                    counters.stale(b, current)
                    stale.append((b, current))
                else:
                    job_beats.append(b)
            now = runtime.clock.now()
            await store.record_heartbeats(conn, beats, job_beats, now)
            if stale:
                await store.note_stale(conn, stale, now)

    async def on_node_events(msgs: list[Msg]) -> None:
        # The node stream carries other node and check events too; only registrations concern this service.
        regs = await runtime.decode_batch(NodeRegistered,
                                  [m for m in msgs if schema_of(m.data) == NodeRegistered.SCHEMA])
        if regs:
            async with runtime.pool.acquire() as conn, conn.transaction():
                for reg in regs:
                    await store.record_registration(conn, reg)
                    await checks.on_registration(conn, reg)

    async def on_check_reports(msgs: list[Msg]) -> None:
        reports = await runtime.decode_batch(CheckReport, msgs)
        provision = []
        if reports:
            async with runtime.pool.acquire() as conn, conn.transaction():
                for rep in sorted(reports, key=lambda r: r.time):
                    provision += await checks.on_report(conn, rep)
            checks.kick()
        for request in provision:  # after the commit: the node is replaced whatever the hook does
            await checks.provision(request)

    def on_commands(model):
        async def handle(msgs: list[Msg]) -> None:
            for cmd in await runtime.decode_batch(model, msgs):
                await checks.on_command(cmd)
        return handle

    async def on_job_events(msgs: list[Msg]) -> None:
        # Our own signal events travel on the same stream under another schema: skip them unread.
        events = await runtime.decode_batch(JobEvent, [m for m in msgs if schema_of(m.data) != SignalChanged.SCHEMA])
        if events:
            async with runtime.pool.acquire() as conn, conn.transaction():
                for ev in sorted(events, key=lambda e: (e.job_id, e.seq)):
                    await store.apply_job_event(conn, ev)

    def consumer(subject: str, stream: str, durable: str, handle, batch: int = 200) -> BatchConsumer:
        return BatchConsumer(runtime.js, subject, s.stream_name(stream), durable, handle, batch=batch)

    return [
        consumer(s.heartbeat_all, "HB", "health-heartbeats", on_heartbeats, batch=500),
        consumer(s.node_all, "NODE", "health-nodes", on_node_events),
        consumer(s.job_all, "JOB", "health-job-events", on_job_events),
        consumer(s.check_all, "NODE", "health-check-reports", on_check_reports, batch=50),
        *(consumer(s.cmd(m.KIND), "CMD", f"health-{m.KIND}", on_commands(m), batch=10)
          for m in (RunHealthCheck, DrainNode, UndrainNode, ClearGroupAlert)),
    ]
