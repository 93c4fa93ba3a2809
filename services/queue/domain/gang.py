"""The lifecycle's rules for gangs (jobs with ``workers > 1``), called from ``lifecycle.decide``.

A gang is granted all its nodes at once and is ``admitting`` until every worker says its process group has
formed; then it is ``running``. A gang that does not form by its ready deadline releases every node and goes
to ``backoff`` (or ``failed`` with reason ``gang_timeout`` once the policy's limit is used up), and is queued
again when its back-off ends. While it runs, each worker holds its own lease, and each worker's end is
recorded; the job's fate is decided by what the ends say together:

- a worker's real training failure spends an attempt at once (the other workers are stopped);
- a worker that lost its node or its contact (abandoned, stopped unasked, lease expired) is a node failure:
  the policy's strategy applies (``requeue_gang``: every worker stops and the job is queued again without
  spending an attempt, resuming from the latest checkpoint; ``fail_job``);
- a worker whose peer vanished (exit status ``EXIT_PEER_LOST``) says only that *someone* is gone: it waits for
  the real cause to arrive (the failing worker's report, or the silent worker's lease expiry). Deciding on the
  first "peer lost" would turn a deterministic training crash on one rank into an endless free requeue.
- the job succeeds when every worker has succeeded.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from libs.contracts.jobs import AttemptCause, JobEventKind, JobState
from libs.contracts.leases import LeaseEventKind
from libs.contracts.policies import NodeFailureStrategy
from libs.contracts.telemetry import EXIT_PEER_LOST, RunOutcome

from . import preemption
from .endings import CEILING_STOP
from .gang_admission import backoff_due, timed_out
from .preemption import PREEMPTED
from .facts import (
    AdmissionDue,
    Effect,
    EventDraft,
    Finished,
    GangWorker,
    Granted,
    Job,
    LeaseExpired,
    LeaseFact,
    NodeFailed,
    ReadyTimedOut,
    Refusal,
    Renew,
    RunOn,
    StopOn,
    Transition,
    WorkerReady,
    evolve,
)

PEER_LOST = "peer_lost"  # how a worker ended when its process exited with EXIT_PEER_LOST
GANG_TIMEOUT = AttemptCause.GANG_TIMEOUT.value
NODE_FAILURE = AttemptCause.NODE_FAILURE.value


def live(gang: tuple[GangWorker, ...]) -> tuple[str, ...]:
    """Workers whose process has not ended."""
    return tuple(w.executor_id for w in gang if w.ended is None)


def earliest_lease(gang: tuple[GangWorker, ...]) -> datetime | None:
    """The job's lease is the earliest of its live workers' leases: the first worker to go silent ends it."""
    leases = [w.lease_expires_at for w in gang if w.ended is None and w.lease_expires_at is not None]
    return min(leases) if leases else None


def _rank(job: Job, executor_id: str | None) -> int | None:
    for i, w in enumerate(job.gang):
        if w.executor_id == executor_id:
            return i
    return None


def _with_worker(job: Job, rank: int, **changes: Any) -> tuple[GangWorker, ...]:
    return tuple(replace(w, **changes) if i == rank else w for i, w in enumerate(job.gang))


# -- admission --------------------------------------------------------------------------------------------

def on_granted(job: Job, fact: Granted, now: datetime) -> Transition:
    """queued -> admitting: every worker is told its rank and where to meet; the clock of the ready timeout
    starts now."""
    attempt = job.attempt_number + 1
    gang = tuple(GangWorker(e, lease_expires_at=fact.expires_at) for e in fact.workers)
    new = evolve(job, state=JobState.ADMITTING, lease_epoch=fact.epoch, executor_id=fact.workers[0],
                  workers=fact.workers, gang=gang, lease_expires_at=fact.expires_at, attempt_number=attempt,
                  rendezvous=fact.rendezvous, ready_deadline=fact.ready_deadline, admitted_at=now,
                  next_admission_at=None, on_node_failure=fact.on_node_failure, reason=None, stop_requested=None,
                  updated_at=now)
    detail = {"attempt": attempt, "workers": list(fact.workers), "expires_at": fact.expires_at.isoformat(),
              "rendezvous": fact.rendezvous,
              "ready_deadline": fact.ready_deadline.isoformat() if fact.ready_deadline else None}
    event = EventDraft(JobEventKind.LEASED, new.state, job.state, epoch=fact.epoch, executor_id=fact.workers[0],
                       detail=detail)
    return Transition(new, (event,), (RunOn(fact.workers, fact.epoch, attempt),
                                      LeaseFact(LeaseEventKind.GRANTED, fact.epoch, fact.workers[0], fact.expires_at)))


def on_renew(job: Job, fact: Renew) -> Transition | Refusal:
    """Each worker renews its own lease (the caller has checked state and epoch)."""
    rank = _rank(job, fact.executor_id)
    if rank is None:
        return Refusal("the lease is held by another executor")
    if job.gang[rank].ended is not None:
        return Refusal(f"this worker's run has ended ({job.gang[rank].ended})")
    gang = _with_worker(job, rank, lease_expires_at=fact.expires_at)
    return Transition(evolve(job, gang=gang, lease_expires_at=earliest_lease(gang)))


def on_ready(job: Job, fact: WorkerReady, now: datetime) -> Transition:
    """A worker's group formed; the last one makes the gang run."""
    if fact.epoch != job.lease_epoch:
        return Transition.stale_epoch(job, fact.epoch)
    if job.state is not JobState.ADMITTING:
        return Transition.unchanged(job, f"job is {job.state}")
    rank = _rank(job, fact.executor_id)
    if rank is None:
        return Transition.unchanged(job, f"{fact.executor_id} is not a worker of this gang")
    if job.gang[rank].ready_at is not None:
        return Transition.unchanged(job, "worker already ready")
    gang = _with_worker(job, rank, ready_at=now)
    ready = sum(w.ready_at is not None for w in gang)
    events = [EventDraft(JobEventKind.WORKER_READY, JobState.ADMITTING, JobState.ADMITTING, epoch=fact.epoch,
                         executor_id=fact.executor_id,
                         detail={"rank": rank, "ready": ready, "world_size": len(gang)})]
    if ready < len(gang):
        return Transition(evolve(job, gang=gang, updated_at=now), tuple(events))
    new = evolve(job, state=JobState.RUNNING, gang=gang, ready_deadline=None, lease_expires_at=earliest_lease(gang),
                  updated_at=now)
    forming = (now - job.admitted_at).total_seconds() if job.admitted_at else None
    events.append(EventDraft(JobEventKind.ADMITTED, JobState.RUNNING, JobState.ADMITTING, epoch=fact.epoch,
                             executor_id=job.executor_id,
                             detail={"workers": list(job.workers), "rendezvous": job.rendezvous,
                                     "seconds_to_ready": forming, "backoff_count": job.backoff_count}))
    return Transition(new, tuple(events))


def on_ready_timeout(job: Job, fact: ReadyTimedOut, now: datetime) -> Transition:
    """admitting past the deadline -> backoff (or failed when the limit is used up). Every reservation is
    released and every worker stopped; no training attempt is spent (the time is not charged either: workers
    are metered only once ready)."""
    if job.state is not JobState.ADMITTING or fact.epoch != job.lease_epoch:
        return Transition.unchanged(job, f"job is {job.state}, epoch {job.lease_epoch}")
    if not timed_out(job.ready_deadline, now):
        return Transition.unchanged(job, "ready deadline not reached")
    not_ready = [w.executor_id for w in job.gang if w.ready_at is None]
    effects: tuple[Effect, ...] = (
        StopOn(job.workers, job.lease_epoch, GANG_TIMEOUT, checkpoint_first=False),
        LeaseFact(LeaseEventKind.RELEASED, job.lease_epoch, job.executor_id or "", reason=GANG_TIMEOUT))
    attempts = {**job.attempts, GANG_TIMEOUT: job.attempts.get(GANG_TIMEOUT, 0) + 1}
    detail: dict[str, Any] = {"not_ready": not_ready, "ready_deadline": job.ready_deadline.isoformat()
                              if job.ready_deadline else None, "backoff_count": job.backoff_count}
    if fact.backoff is None:
        new = leave(evolve(job, attempts=attempts), JobState.FAILED, now, reason=GANG_TIMEOUT)
        return Transition(new, (EventDraft(JobEventKind.FAILED, new.state, job.state, reason=GANG_TIMEOUT,
                                           epoch=job.lease_epoch, executor_id=job.executor_id, detail=detail),),
                          effects)
    b = fact.backoff
    at = b.requeue_at(now)
    new = leave(evolve(job, attempts=attempts, backoff_count=b.n, next_admission_at=at), JobState.BACKOFF, now,
                reason=GANG_TIMEOUT)
    detail.update(backoff_count=b.n, base_delay_seconds=b.base_delay_seconds, delay_seconds=b.delay_seconds,
                  jitter=b.jitter, next_admission_at=at.isoformat())
    return Transition(new, (EventDraft(JobEventKind.BACKOFF, new.state, job.state, reason=GANG_TIMEOUT,
                                       epoch=job.lease_epoch, executor_id=job.executor_id, detail=detail),), effects)


def on_admission_due(job: Job, fact: AdmissionDue, now: datetime) -> Transition:
    """backoff -> queued when its time has come; it keeps its place by arrival time."""
    if job.state is not JobState.BACKOFF:
        return Transition.unchanged(job, f"job is {job.state}")
    if not backoff_due(job.next_admission_at, now):
        return Transition.unchanged(job, "back-off not over")
    new = evolve(job, state=JobState.QUEUED, next_admission_at=None, reason=None, updated_at=now)
    return Transition(new, (EventDraft(JobEventKind.REQUEUED, new.state, job.state, reason=GANG_TIMEOUT,
                                       detail={"backoff_count": job.backoff_count}),))


# -- the run ----------------------------------------------------------------------------------------------

def on_finished(job: Job, fact: Finished, now: datetime, attempt_failed: Any, interrupt: Any) -> Transition:
    """One worker's process ended (the caller checked epoch and state: admitting or running).

    ``attempt_failed`` and ``interrupt`` are the lifecycle's own rules for a training failure and a ceiling
    stop, passed in so that gangs and single workers spend attempts and interrupt the same way."""
    rank = _rank(job, fact.executor_id)
    if rank is None:
        return Transition.unchanged(job, f"{fact.executor_id} is not a worker of this run")
    if job.gang[rank].ended is not None:
        return Transition.unchanged(job, "worker already ended")
    peer_lost = fact.outcome is RunOutcome.FAILED and fact.exit_code == EXIT_PEER_LOST
    gang = _with_worker(job, rank, ended=PEER_LOST if peer_lost else fact.outcome.value)
    last = job.last_step if fact.last_step is None else max(fact.last_step, job.last_step or 0)
    job1 = evolve(job, gang=gang, lease_expires_at=earliest_lease(gang), last_step=last, updated_at=now)
    detail = {"outcome": fact.outcome.value, "exit_code": fact.exit_code, "last_step": fact.last_step, "rank": rank}
    others = tuple(e for e in live(gang))
    everyone_ended = not others

    # 0. A preemption's stop (checkpoint first): queued again for free once every worker has ended, so rank 0's
    # checkpoint is reported first, whatever way each process ended (as a single worker's preempted run); a gang
    # whose every worker succeeded before it could stop has succeeded (5.).
    if job.stop_requested == PREEMPTED:
        if not everyone_ended:
            return Transition(job1)
        if not all(w.ended == RunOutcome.SUCCEEDED.value for w in gang):
            return preemption.requeue(job1, fact.epoch, now, leave, detail)
    # 1. A real training failure: spend an attempt now, and stop the rest of the gang.
    if fact.outcome is RunOutcome.FAILED and not peer_lost and job.stop_requested != CEILING_STOP:
        t = attempt_failed(job1, fact, now, detail)
        stop = (StopOn(others, job.lease_epoch, AttemptCause.TRAINING_ERROR.value, checkpoint_first=False),)
        return replace(t, effects=(*t.effects, *(stop if others else ())))
    # 2. A ceiling stop: interrupted once every worker has ended, so rank 0's final checkpoint is reported first.
    if job.stop_requested == CEILING_STOP:
        return interrupt(job1, fact.epoch, now, detail) if everyone_ended else Transition(job1)
    # 3. A worker handed its grant back unstarted (busy, checking its node): the gang cannot form with it, so
    # it is requeued now (free, counted as a hand-back) rather than left to time out and back off.
    if fact.outcome is RunOutcome.HANDED_BACK:
        return node_failure(job1, (fact.executor_id or "",), f"handed back: {fact.error}", now, detail,
                            cause=AttemptCause.HANDED_BACK.value)
    if job.state is JobState.ADMITTING:
        return Transition(job1)  # a gang that cannot form is the ready timeout's to handle
    # 4. This worker lost its node or its contact.
    if fact.outcome in (RunOutcome.ABANDONED, RunOutcome.STOPPED):
        why = "abandoned" if fact.outcome is RunOutcome.ABANDONED else "stopped by executor"
        return node_failure(job1, (fact.executor_id or "",), why, now, detail)
    # 5. Succeeded, or lost a peer: decided when everyone has ended.
    if not everyone_ended:
        return Transition(job1)
    if all(w.ended == RunOutcome.SUCCEEDED.value for w in gang):
        new = leave(job1, JobState.SUCCEEDED, now)
        return Transition(new, (EventDraft(JobEventKind.SUCCEEDED, new.state, job.state, epoch=fact.epoch,
                                           executor_id=job.executor_id, detail=detail),),
                          (LeaseFact(LeaseEventKind.RELEASED, job.lease_epoch, job.executor_id or "",
                                     reason="succeeded"),))
    lost = tuple(w.executor_id for w in gang if w.ended == PEER_LOST)
    return node_failure(job1, lost, "every worker lost a peer", now, detail)


def on_lease_expired(job: Job, fact: LeaseExpired, now: datetime) -> Transition:
    """A running gang whose worker went silent for a whole lease: that worker's node is lost."""
    lost = tuple(w.executor_id for w in job.gang
                 if w.ended is None and w.lease_expires_at is not None and w.lease_expires_at < now)
    if not lost:
        return Transition.unchanged(job, "no worker's lease has expired")
    return node_failure(job, lost, "lease expired", now, {})


def on_node_failed(job: Job, fact: NodeFailed, now: datetime) -> Transition:
    """The health service failed the node of a running gang's live worker: a node failure, without waiting for
    its lease. Anything else is not the gang's business (a forming gang has its ready timeout; a single worker
    is never checked while it runs)."""
    if job.state is not JobState.RUNNING or not job.gang or fact.executor_id not in live(job.gang):
        return Transition.unchanged(job, "not a live worker of a running gang")
    return node_failure(job, (fact.executor_id,), f"node failed: {fact.reason}", now, {})


def node_failure(job: Job, lost: tuple[str, ...], why: str, now: datetime, detail: dict[str, Any], *,
                 cause: str = NODE_FAILURE) -> Transition:
    """Apply the strategy the job was admitted under: stop every other worker, then requeue the gang (free:
    it resumes from its latest checkpoint, counted under ``cause``) or fail the job. A pending ceiling stop
    wins: the budget is spent. A worker that handed its grant back never started: the gang is requeued
    whatever the strategy, since no node failed."""
    others = tuple(e for e in live(job.gang) if e not in lost)
    effects: list[Effect] = []
    if others:
        effects.append(StopOn(others, job.lease_epoch, cause, checkpoint_first=False))
    effects.append(LeaseFact(LeaseEventKind.RELEASED, job.lease_epoch, job.executor_id or "", reason=cause))
    event = EventDraft(JobEventKind.WORKER_LOST, JobState.RUNNING, JobState.RUNNING, reason=why,
                       epoch=job.lease_epoch, executor_id=lost[0] if lost else None,
                       detail={**detail, "lost": list(lost), "strategy": job.on_node_failure})
    if job.stop_requested == CEILING_STOP:
        new = leave(job, JobState.INTERRUPTED, now, reason=CEILING_STOP)
        final = EventDraft(JobEventKind.INTERRUPTED, new.state, JobState.RUNNING, reason=CEILING_STOP,
                           epoch=job.lease_epoch, executor_id=job.executor_id)
    elif job.on_node_failure == NodeFailureStrategy.FAIL_JOB.value and cause == NODE_FAILURE:
        new = leave(job, JobState.FAILED, now, reason=NODE_FAILURE)
        final = EventDraft(JobEventKind.FAILED, new.state, JobState.RUNNING, reason=NODE_FAILURE,
                           epoch=job.lease_epoch, executor_id=job.executor_id, detail={"lost": list(lost)})
    else:
        attempts = {**job.attempts, cause: job.attempts.get(cause, 0) + 1}
        new = leave(evolve(job, attempts=attempts), JobState.QUEUED, now)
        final = EventDraft(JobEventKind.REQUEUED, new.state, JobState.RUNNING, reason=cause,
                           epoch=job.lease_epoch, detail={"node_failures" if cause == NODE_FAILURE else cause:
                                                          attempts[cause]})
    return Transition(new, (event, final), tuple(effects))


def leave(job: Job, state: JobState, now: datetime, *, reason: str | None = None) -> Job:
    """The gang stops holding nodes (as ``lifecycle._leave_run``, which calls this for every job)."""
    return evolve(job, state=state, workers=(), gang=(), lease_expires_at=None, ready_deadline=None,
                   stop_requested=None, reason=reason,
                   executor_id=None if state in (JobState.QUEUED, JobState.BACKOFF) else job.executor_id,
                   updated_at=now)
