"""The two loops that move jobs on their own: placement (queued -> running with a lease grant) and the lease
scanner (running with an expired lease -> queued, or interrupted when a ceiling stop was pending).

Both run as singleton loops (one replica at a time), and both read the time from PostgreSQL, the clock every
lease deadline is set on. Placement also takes a transaction-scoped advisory lock and
row locks (``FOR UPDATE SKIP LOCKED``), so even two replicas that both believe they lead cannot place twice: the
second waits for the first to commit, then sees its executors busy and its jobs running.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import asyncpg

from opentelemetry.trace import SpanKind

from libs.runtime import metrics, tracing
from libs.runtime.db import lock_key
from libs.runtime.service import Runtime

from . import org_budgets, remaining, scans, store, tenancy_edge
from .domain import lifecycle as lc
from .domain.gang_admission import QueuedJob
from .domain.wakes import pass_size, widen
from .effects import messages_for
from .gangs import GangGrants
from .settings import QueueSettings
from .tenancy.placement import plan
from .tenancy.placement_types import Admit, Snapshot, Wait, WaitCode
from .tenancy.beyond import beyond_due
from .tenancy.model import Pending, checkpoint_quota

log = logging.getLogger(__name__)


def pending_of(job: scans.Queued, needs_gpu_seconds: float = 0.0) -> Pending:
    return Pending(job.id, job.org, job.created_at, job.workers, job.gpus_per_worker, job.priority, job.project,
                   needs_gpu_seconds, job.environment)


class Scheduler:
    def __init__(self, runtime: Runtime, settings: QueueSettings, kick: Callable[[], None] = lambda: None) -> None:
        self.runtime = runtime
        self.settings = settings
        self.kick = kick  # wakes the outbox relay: a grant should reach the executor at once
        self.placed = 0
        self.expired = 0
        self.preempted = 0
        self.skipped = 0  # passes not made: jobs queued, no executor free, the last whole pass under a tick ago
        self.widened = 0  # passes sized to the free executors that left some free, made whole at once
        self._whole_at: float | None = None  # monotonic time of the last whole pass
        self._beyond_at: float | None = None  # monotonic time the reasons beyond a whole pass were last written

    @property
    def silent_after(self) -> float:
        return self.settings.executor_silence_heartbeats * self.settings.heartbeat_seconds

    async def place_once(self) -> int:
        most = self.settings.max_jobs_per_pass
        async with self.runtime.pool.acquire() as conn:
            queued, free = await scans.queued_and_free(conn, self.silent_after, most=most,
                                                       require_checked=self.settings.require_checked_nodes)
            since = None if self._whole_at is None else time.monotonic() - self._whole_at
            size = pass_size(queued, free, since, self.settings.schedule_interval_seconds, most)
            if not size:
                self.skipped += 1 if queued else 0
                return 0
            placed, workers, considered = await self._pass(conn, size)
            if widen(size, most, considered, workers, free):
                self.widened += 1
                placed += (await self._pass(conn, most))[0]
        return placed

    async def _pass(self, conn: asyncpg.Connection, size: int) -> tuple[int, int, int]:
        """One pass over at most ``size`` candidates: (jobs placed, executors they took, candidates found)."""
        lease = timedelta(seconds=self.settings.lease_seconds)
        timeout = self.settings.budget_rpc_timeout_seconds
        waited: list[float] = []  # queued -> granted, of each grant (observed once committed)
        if size >= self.settings.max_jobs_per_pass:
            self._whole_at = time.monotonic()
        async with conn.transaction():
            # 1. Serialize placement passes across replicas, before anything is chosen: the candidates are
            # chosen once, on everything an earlier pass committed, and no pass can commit between this
            # choice and these grants (a choice made before the lock could be stale by a whole pass).
            # The time is the database's, read once the lock is held: lease deadlines and executor freshness
            # are judged on one clock whichever replica places (never this replica's own wall clock).
            # One round trip: the target list is evaluated in order, so the clock is read once the lock is held.
            now = (await conn.fetchrow("SELECT pg_advisory_xact_lock($1), clock_timestamp() AS now",
                                       lock_key(f"{self.settings.subject_prefix}:queue:placement")))["now"]
            orgs = await tenancy_edge.organisations(conn)
            # The candidates by share deficit (tenancy/candidates.py): a big organisation's many queued jobs
            # cannot hide a small one's from fair share.
            chosen = await tenancy_edge.candidates(conn, orgs, size)
            if not chosen:
                return 0, 0, 0
            # 2. The budget is asked about exactly these candidates, with no row locked yet (its answers take
            # up to the RPC timeout; only the placement lock, which nothing but placement passes take, is
            # held meanwhile): what is left of the ceiling of each job placed again, and budgeted
            # organisations' consumption this period for their reservations.
            again = await scans.queued_jobs_placed_before(conn, chosen)
            budgeted = org_budgets.budgeted(orgs)
            consumption = (await org_budgets.ask(self.runtime, conn, orgs, now, timeout,
                                                 jobs=[j.id for j in again])
                           if budgeted else org_budgets.Consumption())
            used = await remaining.ask(self.runtime, again, timeout) if again else {}
            if again or budgeted:  # the answers took time: deadlines and freshness are judged from after them
                now = await store.db_now(conn)
            # 3. Snapshot: the candidates locked (a job that left the queue or another transaction holds
            # meanwhile is left out, never granted) and read as the columns planning needs (the whole job
            # only for those granted, step 5); schedulable executors, free or busy; running jobs.
            jobs = await scans.queued_candidates(conn, chosen)
            if not jobs:
                return 0, 0, len(chosen)
            nodes = await tenancy_edge.schedulable_nodes(conn, now, self.silent_after,
                                                         require_checked=self.settings.require_checked_nodes)
            gangs = await GangGrants.snapshot(conn, self.settings)
            wanted = [QueuedJob(j.id, j.created_at, j.workers, j.gpus_per_worker) for j in jobs]
            allowed = {q.job_id for q in await gangs.admissible(conn, wanted)}
            # Budgeted organisations: consumed this period (step 2's answers) and running jobs' remaining ceilings.
            accounts, needs, unknown = await org_budgets.accounts(conn, orgs, consumption, jobs)
            unanswered = {j.id for j in jobs if j.org in unknown}
            pending = [pending_of(j, needs.get(j.id, 0.0)) for j in jobs
                       if j.id in allowed and j.id not in unanswered]
            snapshot = Snapshot(orgs, nodes, pending, await tenancy_edge.running(conn),
                                await tenancy_edge.cohorts(conn), accounts, broken=orgs.broken)
            # 4. Decide on the snapshot: fair share, quotas, borrowing, reclaim (services/queue/tenancy).
            result = plan(snapshot)
            assignments = result.admitted
            by_id = await scans.jobs_by_id(conn, [a.job_id for a in assignments])
            # What each grant carries of its ceiling (the budget's answers asked in step 2).
            left = remaining.remaining_of([by_id[a.job_id] for a in assignments], used)
            # 5. Grant each: job running (a gang: admitting) under the next epoch, RunJob and LeaseEvent in the
            # same transaction; the node group and devices its organisation's quota counts. Each grant continues
            # its job's trace (its messages carry it to the executors).
            # Staged one by one, written together (three statements for the whole pass, not three per grant).
            traces = await store.traces_of(conn, [a.job_id for a in assignments]) if assignments else {}
            placed: dict[str, tuple[str, int]] = {}
            grants: list[tuple[store.Staged, str, int]] = []
            staged: list[store.Staged] = []  # a transition that changed more than a grant's columns: written whole
            for a in assignments:
                job = by_id[a.job_id]
                with tracing.continued(traces.get(a.job_id), "queue grant", kind=SpanKind.INTERNAL, new_trace=False,
                                       job_id=a.job_id, executors=list(a.workers)):
                    grant = await self._grant(conn, job, a, gangs, now, now + lease, left.get(job.id),
                                              checkpoint_quota(job.spec.checkpoint_quota_bytes, orgs.get(job.org)))
                    if grant is None:
                        continue
                if store.only_granted(job, grant.job):
                    grants.append((grant, a.group, a.devices))
                else:
                    staged.append(grant)
                placed[job.id] = (a.group, a.devices)
                waited.append(max(0.0, (now - job.updated_at).total_seconds()))
            # The grants' columns with their node group and devices (what the quota counts) in one statement.
            await store.write_grants(conn, self.settings.subjects, grants)
            await store.write_staged(conn, self.settings.subjects, staged)
            await tenancy_edge.note_run(conn, {s.job.id: placed[s.job.id] for s in staged})
            if placed:
                log.info("fair-share order of this pass: %s", "; ".join(result.order))
            # 6. Borrowed capacity reclaimed: checkpoint first, requeued for free (domain/preemption.py).
            for p in result.preempted:
                victim = await store.load_job(conn, p.job_id, lock=True)
                t = lc.decide(victim, lc.Preempt(p.for_org, p.for_job, p.reason), now)
                if isinstance(t, lc.Transition) and t.changed:
                    await store.write(conn, self.settings.subjects, t, now, messages_for(t.job, t, self.settings))
                    self.preempted += 1
                    log.warning("job %s of %s preempted for %s of %s: %s", p.job_id, p.org, p.for_job, p.for_org,
                                p.reason)
            # 7. Why every job still queued waits.
            waits = [*result.waiting.values(),
                     *(Wait(j.id, WaitCode.GANG_SEQUENTIAL, "gang admission is sequential: another gang is "
                            "admitting or queued before this one") for j in jobs if j.id not in allowed),
                     *(Wait(j, WaitCode.BUDGET, org_budgets.UNANSWERED) for j in unanswered)]
            since = None if self._beyond_at is None else time.monotonic() - self._beyond_at
            if (size >= self.settings.max_jobs_per_pass and len(chosen) >= size  # a whole pass, and more queued
                    and beyond_due(since, self.settings.waiting_refresh_seconds)):
                waits += await tenancy_edge.waits_beyond(conn, orgs, chosen)
                self._beyond_at = time.monotonic()
            await tenancy_edge.note_waits(conn, waits, now)
        if placed or result.preempted:
            self.placed += len(placed)
            self.kick()
        metrics.GRANTS.inc(len(waited))
        for seconds in waited:
            metrics.PLACEMENT_LATENCY.observe(seconds)
        return len(placed), sum(len(a.workers) for a in assignments if a.job_id in placed), len(chosen)

    async def _grant(self, conn: asyncpg.Connection, job: lc.Job, assignment: Admit, gangs: GangGrants,
                     now: datetime, expires: datetime, remaining: float | None,
                     ckpt_quota: int | None = None) -> store.Staged | None:
        """Stage the grant of one placed job (its gang's leases, the transition, RunJob and LeaseEvent for the
        outbox, under the caller's span); None when it cannot be granted."""
        granted = await gangs.grant(conn, job, assignment.workers, expires, now)
        if granted is None:
            return None
        t = lc.decide(job, granted, now)
        if isinstance(t, lc.Refusal):  # cannot happen on a locked queued row; never apply if it does
            log.error("placement of %s refused: %s", job.id, t.reason)
            return None
        # Every value of a grant's messages is the pass's own or the stored job's: not validated again.
        staged = store.stage(self.settings.subjects, t, now,
                             messages_for(t.job, t, self.settings, remaining, trusted=True,
                                          checkpoint_quota=ckpt_quota), trusted=True)
        log.info("job %s of %s placed on %s (epoch %d, rank %d: %s)", job.id, job.org, ", ".join(assignment.workers),
                 t.job.lease_epoch, assignment.rank, assignment.why)
        return staged

    async def scan_once(self) -> int:
        n = 0
        async with self.runtime.pool.acquire() as conn, conn.transaction():
            now = await store.db_now(conn)  # the clock the deadlines were set on, whichever replica set them
            for job in await scans.expired_leases(conn, now):
                t = lc.decide(job, lc.LeaseExpired(job.lease_epoch), now)
                if isinstance(t, lc.Transition) and t.changed:
                    await store.write(conn, self.settings.subjects, t, now, messages_for(t.job, t, self.settings))
                    log.warning("lease of job %s (epoch %d, executor %s) expired: %s", job.id, job.lease_epoch,
                                job.executor_id, t.job.state)
                    n += 1
        if n:
            self.expired += n
            metrics.LEASE_EXPIRIES.inc(n)
            self.kick()
        return n
