"""What executors and the budget tell the queue about runs: progress reports, lease renewals, ceiling
exhaustion, heartbeats. Each becomes a lifecycle fact applied under the job's row lock; facts from an older lease
epoch are counted and otherwise ignored, so a zombie executor can never move a job it lost. Lease deadlines and
executors' last-seen times are on the database's clock (``store.db_now``), never a replica's own."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta

from libs.contracts.budget import BudgetEvent, BudgetEventKind
from libs.contracts.leases import LeaseRenewReply, LeaseRenewRequest
from libs.contracts.nodes import NODE_LOST_STATES, NodeEvent
from libs.contracts.telemetry import (
    CheckpointReport,
    CheckpointSkipped,
    CheckpointStoreNote,
    Heartbeat,
    LEAVING_REASONS,
    ProgressBase,
    RunFinished,
    RunOutcome,
    RunStarted,
    StepReport,
    WorkerReady,
)
from libs.runtime import metrics, tracing
from libs.runtime.fencing import StaleCounter, StaleEpoch, is_stale
from libs.runtime.service import Runtime
from libs.runtime import wake
from libs.runtime.edge import Stamped
from libs.runtime.unit import Units

from . import executors, store
from .domain import lifecycle as lc
from .domain.liveness import seen_at
from .domain.wakes import PLACEMENT, offers_an_executor
from .effects import apply, messages_for
from .settings import QueueSettings

log = logging.getLogger(__name__)


def fact_of(msg: ProgressBase) -> lc.Fact:
    """The lifecycle fact a progress message states."""
    if isinstance(msg, RunStarted):
        confinement, allocation = msg.detail.get("confinement"), msg.detail.get("allocation")
        return lc.Started(msg.epoch, msg.resumed_from_step, msg.resumed_from, msg.device,
                          confinement if isinstance(confinement, dict) else None,
                          allocation if isinstance(allocation, dict) else None)
    if isinstance(msg, StepReport):
        return lc.StepReported(msg.epoch, msg.step, msg.total_steps, msg.step_seconds)
    if isinstance(msg, CheckpointReport):
        return lc.Checkpointed(msg.epoch, msg.step, msg.path, msg.time, msg.sha256, msg.bytes,
                               kind=str(msg.checkpoint_kind), files=msg.files, upload_seconds=msg.upload_seconds,
                               stored_bytes=msg.stored_bytes)
    if isinstance(msg, CheckpointSkipped):
        return lc.CheckpointSkipped(msg.epoch, msg.path, msg.reason)
    if isinstance(msg, RunFinished):
        return lc.Finished(msg.epoch, msg.outcome, msg.exit_code, msg.error, msg.last_step, msg.executor_id,
                           msg.stop_reason)
    if isinstance(msg, WorkerReady):
        return lc.WorkerReady(msg.epoch, msg.executor_id)
    if isinstance(msg, CheckpointStoreNote):
        return lc.StoreNoted(msg.epoch, msg.state.value, msg.model_dump(
            mode="json", include={"store", "step", "path", "bytes", "behind", "reason"}, exclude_none=True))
    raise TypeError(f"not a progress message: {type(msg).__name__}")


def decide_report(job: lc.Job | None, msg: ProgressBase, now: datetime) -> lc.Transition | lc.Refusal:
    """What a run report does to its job: refused unless its executor holds the run it reports on, else the
    lifecycle's decision on the fact it states (``effects.apply`` without the I/O)."""
    refusal = lc.from_holder(job, msg.executor_id, msg.epoch)
    return refusal if refusal is not None else lc.decide(job, fact_of(msg), now)


def _report_span(msg: ProgressBase) -> AbstractContextManager[object]:
    return tracing.continued(tracing.of(msg), f"queue progress {getattr(msg, 'kind', 'report')}", new_trace=False,
                             job_id=msg.job_id, epoch=msg.epoch)


class Runs:
    def __init__(self, runtime: Runtime, settings: QueueSettings, units: Units | None = None) -> None:
        self.runtime = runtime
        self.settings = settings
        self.units = units or Units(runtime.pool, store.SCHEMA, runtime.subjects, StaleCounter("queue"))
        self.handed_back = 0  # grants executors gave back unstarted: should be rare (placement raced a check)

    @property
    def stale(self) -> StaleCounter:
        return self.units.counter

    async def progress(self, msg: ProgressBase) -> lc.Transition | lc.Refusal:
        """One run report in its own transaction (a batch of one)."""
        return (await self.progress_all([msg]))[0]

    async def progress_all(self, reports: Sequence[ProgressBase]) -> list[lc.Transition | lc.Refusal]:
        """A fetched batch of run reports in one transaction, each decided in arrival order against its job as
        the reports before it left it (a job's reports keep their order: a checkpoint before the finish that
        follows it). Statements per batch, not per report: the jobs read and locked in one (in id order, so two
        batches never wait on each other in a cycle), the changed jobs, their events and outbox rows in three
        pipelined ones (``store.write_staged``), the accepted steps in one. What follows a commit (a forgery
        refused visibly, a warning) follows it for each report in turn."""
        now = self.runtime.clock.now()
        results: list[lc.Transition | lc.Refusal] = []
        async with self.units.begin() as unit:
            jobs = await store.load_jobs(unit.conn, sorted({r.job_id for r in reports}), lock=True)
            staged: list[store.Staged] = []
            steps: list[StepReport] = []
            for msg in reports:
                with _report_span(msg):  # the job events it causes continue the run's trace
                    result = decide_report(jobs.get(msg.job_id), msg, now)
                    if isinstance(result, lc.Transition) and result.changed:
                        staged.append(store.stage(self.settings.subjects, result, now,
                                                  messages_for(result.job, result, self.settings)))
                        jobs[msg.job_id] = staged[-1].job
                        if isinstance(msg, StepReport):
                            steps.append(msg)  # the history of what the lifecycle accepted
                results.append(result)
                if isinstance(result, lc.Transition) and result.stale:
                    await store.note_stale(unit.conn, unit.stale(StaleEpoch(
                        msg.executor_id, msg.job_id, msg.epoch, result.job.lease_epoch, "report")), now)
            await store.write_staged(unit.conn, self.settings.subjects, staged)
            await store.record_steps(unit.conn, steps)
            # Runs whose executors reported their end: those executors are free now, and placement runs at once;
            # one that ended its run to leave (its allocation ends, it shuts down) is not, or it would be granted
            # the next job.
            ended = [(m.executor_id, m.job_id, m.epoch, m.time, m.stop_reason in LEAVING_REASONS)
                     for m, r in zip(reports, results, strict=True)
                     if isinstance(m, RunFinished) and isinstance(r, lc.Transition)]
            if ended:
                await executors.free_ended(unit.conn, ended)
                await wake.notify(unit.conn, wake.channel(self.settings.subject_prefix, PLACEMENT))
        for msg, result in zip(reports, results):
            await self._reported(msg, result)
        return results

    async def _reported(self, msg: ProgressBase, result: lc.Transition | lc.Refusal) -> None:
        """What follows a report's commit: a forgery refused visibly (audited), a refusal or hand-back logged."""
        if isinstance(result, lc.ForeignReport):
            await self.runtime.reject(self.runtime.subjects.progress(msg.job_id, msg.executor_id), msg.encode(),
                                      f"{result.reason}: {result.detail}")
        elif isinstance(result, lc.Refusal):
            log.warning("progress from %s about job %s ignored: %s", msg.executor_id, msg.job_id, result.reason)
        elif isinstance(msg, RunFinished) and msg.outcome is RunOutcome.HANDED_BACK and result.changed:
            self.handed_back += 1
            log.warning("executor %s handed job %s back unstarted (%d so far): %s", msg.executor_id, msg.job_id,
                        self.handed_back, msg.error)

    async def renew(self, req: LeaseRenewRequest) -> LeaseRenewReply:
        """ok only for the executor holding the job's current lease while it runs; the expiry is written before
        the answer, so an acknowledged renewal is never lost to a crash."""
        async with self.units.begin() as unit:
            job = await store.load_job(unit.conn, req.job_id, lock=True)
            # The deadline is on the database's clock, the one the lease scanner of any replica judges it by.
            now = await store.db_now(unit.conn)
            fact = lc.Renew(req.executor_id, req.epoch, now + timedelta(seconds=self.settings.lease_seconds))
            result = lc.decide(job, fact, now)
            if isinstance(result, lc.Transition):
                await store.save_lease(unit.conn, result.job)
            elif job is not None and is_stale(req.epoch, job.lease_epoch):
                await store.note_stale(unit.conn, unit.stale(StaleEpoch(
                    req.executor_id, req.job_id, req.epoch, job.lease_epoch, "renewal")), now)
        metrics.LEASE_RENEWALS.labels("refused" if isinstance(result, lc.Refusal) else "ok").inc()
        if isinstance(result, lc.Refusal):
            return LeaseRenewReply(ok=False, reason=result.reason)
        return LeaseRenewReply(ok=True, expires_at=fact.expires_at)

    async def budget(self, event: BudgetEvent) -> lc.Transition | lc.Refusal | None:
        if event.event is not BudgetEventKind.EXHAUSTED:
            return None  # warnings are the budget's to show; they change nothing here
        now = self.runtime.clock.now()
        async with self.units.begin() as unit:
            result = await apply(unit.conn, self.settings, event.job_id,
                                 lc.StopForCeiling(event.ceiling_seconds, event.consumed_seconds), now)
        if isinstance(result, lc.Refusal):
            log.warning("budget exhausted for job %s ignored: %s", event.job_id, result.reason)
        elif result.changed:
            log.info("job %s reached its GPU ceiling (%.0fs of %.0fs): %s", event.job_id, event.consumed_seconds,
                     event.ceiling_seconds, result.job.state)
        return result

    async def node_event(self, event: NodeEvent) -> None:
        async with self.units.begin() as unit:
            conn = unit.conn
            await store.apply_node_event(conn, event.node_id, event.executor_id, event.group, event.state.value,
                                         event.schedulable, event.reason, event.seq, boot_id=event.boot_id)
            # A failed node under a running gang is a node failure of that gang (its strategy applies now,
            # not a lease later).
            if event.executor_id and event.state in NODE_LOST_STATES:
                now = self.runtime.clock.now()
                fact = lc.NodeFailed(event.executor_id, event.reason or event.state.value)
                for job_id in await store.running_gangs_of(conn, event.executor_id):
                    await apply(conn, self.settings, job_id, fact, now)

    async def heartbeats(self, beats: Sequence[Heartbeat | Stamped[Heartbeat]]) -> int:
        """Upsert the newest heartbeat per executor of a batch (placement needs only the latest), seen when the
        stream stored it (liveness.seen_at)."""
        latest: dict[str, Stamped[Heartbeat]] = {}
        for item in beats:
            beat = item if isinstance(item, Stamped) else Stamped(item, None)
            hb = beat.value
            if hb.executor_id not in latest or latest[hb.executor_id].value.sent_at <= hb.sent_at:
                latest[hb.executor_id] = beat
        if not latest:
            return 0
        async with self.runtime.pool.acquire() as conn, conn.transaction():
            now = await store.db_now(conn)  # last seen on the clock placement judges freshness by
            rows = [(hb.executor_id, hb.node_id, hb.group, len(hb.gpus), hb.accepting, hb.job_id, hb.epoch,
                     hb.phase.value, hb.sent_at, seen_at(now, beat.stored_at), hb.address, "\n".join(hb.environments),
                     hb.boot_id)
                    for beat in latest.values() for hb in [beat.value]]
            await executors.upsert_executors(conn, rows)
            if offers_an_executor([beat.value for beat in latest.values()]):  # perhaps free since the last pass: place now
                await wake.notify(conn, wake.channel(self.settings.subject_prefix, PLACEMENT))
        return len(rows)
