"""The job lifecycle: one pure transition function, ``decide(job, fact, now)``.

A fact is something that happened or was asked (a grant, a progress report, a lease expiry, a command). The
answer is either a ``Transition`` (the job after the fact, the job events to emit, the effects the edges must
carry out) or a ``Refusal`` (the fact is not allowed; nothing is applied). Facts about an older lease epoch, or
about a run the job no longer has, are old news: ``Transition.unchanged`` with the reason it was ignored, so the
edge can count them. Events carry no sequence number; the store numbers them per job.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from libs.contracts.jobs import TERMINAL_STATES, AttemptCause, JobEventKind, JobState
from libs.contracts.leases import LeaseEventKind
from libs.contracts.telemetry import HEALTH_CHECK_STOP, RunOutcome

from . import endings
from . import gang
from . import preemption
from .ceiling import on_ceiling, on_requeue
from .endings import CEILING_STOP
from .preemption import Preempt  # noqa: F401 - re-exported with the other facts
from .facts import (  # noqa: F401 - re-exported: the lifecycle's vocabulary is imported from here
    RUN_FACTS,
    AdmissionDue,
    Cancel,
    Checkpointed,
    CheckpointSkipped,
    StoreNoted,
    Effect,
    EventDraft,
    Fact,
    Finished,
    GangWorker,
    Granted,
    Job,
    evolve,
    LeaseExpired,
    LeaseFact,
    NodeFailed,
    ReadyTimedOut,
    Refusal,
    Renew,
    Requeue,
    Undeliverable,
    RunOn,
    Started,
    StepReported,
    StopForCeiling,
    StopOn,
    Submitted,
    Transition,
    WorkerReady,
    no_attempts,
)

TRANSPORT_LOST = AttemptCause.TRANSPORT_LOST.value
HANDED_BACK = AttemptCause.HANDED_BACK.value
HEALTH_CHECK = AttemptCause.HEALTH_CHECK.value


# -- the transition function ------------------------------------------------------------------------------

def decide(job: Job | None, fact: Fact, now: datetime) -> Transition | Refusal:
    """Apply one fact to a job (``None`` only for a submit)."""
    if isinstance(fact, Submitted):
        return submit(fact, now) if job is None else Refusal("a job with this id already exists", {"job_id": job.id})
    if job is None:
        return Refusal("no such job")
    if isinstance(fact, Granted):
        return on_granted(job, fact, now)
    if isinstance(fact, Renew):
        return on_renew(job, fact, now)
    if isinstance(fact, Cancel):
        return on_cancel(job, fact, now)
    if isinstance(fact, Requeue):
        return on_requeue(job, fact, now)
    if isinstance(fact, StopForCeiling):
        return on_ceiling(job, fact, now)
    if isinstance(fact, RUN_FACTS):
        return on_run_fact(job, fact, now)
    if isinstance(fact, WorkerReady):
        return gang.on_ready(job, fact, now)
    if isinstance(fact, ReadyTimedOut):
        return gang.on_ready_timeout(job, fact, now)
    if isinstance(fact, AdmissionDue):
        return gang.on_admission_due(job, fact, now)
    if isinstance(fact, NodeFailed):
        return gang.on_node_failed(job, fact, now)
    if isinstance(fact, Undeliverable):
        return on_undeliverable(job, fact, now)
    if isinstance(fact, preemption.Preempt):
        return preemption.on_preempt(job, fact, now)
    raise TypeError(f"not a lifecycle fact: {fact!r}")


def submit(fact: Submitted, now: datetime) -> Transition:
    job = Job(id=fact.job_id, name=fact.name or fact.spec.name, owner=fact.owner, spec=fact.spec,
              state=JobState.QUEUED, created_at=now, updated_at=now, org=fact.org, project=fact.spec.project,
              priority=fact.spec.priority,
              ceiling_history=({"ceiling_seconds": fact.spec.gpu_ceiling_seconds, "actor": fact.owner,
                                "at": now.isoformat()},))
    detail = {"spec": fact.spec.model_dump(mode="json"), "owner": fact.owner, "name": job.name, "org": fact.org}
    return Transition(job, (EventDraft(JobEventKind.SUBMITTED, JobState.QUEUED, None, detail=detail),))


def on_granted(job: Job, fact: Granted, now: datetime) -> Transition | Refusal:
    """Only a queued job is placed, and only with the next epoch: a second grant racing the first is refused.
    A gang (several workers) is admitting until every worker is ready; a single worker runs at once."""
    if job.state is not JobState.QUEUED:
        return Refusal(f"cannot place a {job.state} job")
    if fact.epoch != job.lease_epoch + 1 or not fact.workers:
        return Refusal("a grant must carry the next epoch and at least one executor",
                       {"epoch": fact.epoch, "expected": job.lease_epoch + 1})
    if len(fact.workers) > 1:
        return gang.on_granted(job, fact, now)
    attempt = job.attempt_number + 1
    new = evolve(job, state=JobState.RUNNING, lease_epoch=fact.epoch, executor_id=fact.workers[0],
                  workers=fact.workers, lease_expires_at=fact.expires_at, attempt_number=attempt,
                  reason=None, stop_requested=None, updated_at=now)
    event = EventDraft(JobEventKind.LEASED, new.state, job.state, epoch=fact.epoch, executor_id=fact.workers[0],
                       detail={"attempt": attempt, "workers": list(fact.workers),
                               "expires_at": fact.expires_at.isoformat()})
    return Transition(new, (event,), (RunOn(fact.workers, fact.epoch, attempt),
                                      LeaseFact(LeaseEventKind.GRANTED, fact.epoch, fact.workers[0], fact.expires_at)))


def on_renew(job: Job, fact: Renew, now: datetime) -> Transition | Refusal:
    """Renewal is the executor's proof of contact; a refusal tells it to stop its process at once."""
    if fact.epoch < job.lease_epoch:
        return Refusal(f"stale epoch: lease {job.lease_epoch} is current", {"current_epoch": job.lease_epoch})
    if job.state not in (JobState.RUNNING, JobState.ADMITTING) or fact.epoch != job.lease_epoch:
        return Refusal("job cancelled" if job.state is JobState.CANCELLED else f"job ended: it is {job.state}")
    if job.gang:
        return gang.on_renew(job, fact)
    if fact.executor_id not in job.workers:
        return Refusal("the lease is held by another executor")
    return Transition(evolve(job, lease_expires_at=fact.expires_at))


def on_cancel(job: Job, fact: Cancel, now: datetime) -> Transition | Refusal:
    """Cancel is immediate: the job is cancelled now, and a running process is told to stop."""
    if job.state in TERMINAL_STATES:
        return Refusal(f"job already {job.state}", {"state": job.state.value})
    effects: tuple[Effect, ...] = ()
    if job.state in (JobState.RUNNING, JobState.ADMITTING):
        effects = (StopOn(job.workers, job.lease_epoch, "cancelled", checkpoint_first=False),
                   LeaseFact(LeaseEventKind.RELEASED, job.lease_epoch, job.executor_id or "", reason="cancelled"))
    new = _leave_run(job, JobState.CANCELLED, now, reason=fact.reason)
    event = EventDraft(JobEventKind.CANCELLED, new.state, job.state, reason=fact.reason,
                       epoch=job.lease_epoch or None, executor_id=job.executor_id, detail={"actor": fact.actor})
    return Transition(new, (event,), effects)


def on_undeliverable(job: Job, fact: Undeliverable, now: datetime) -> Transition:
    """The bus cannot carry a message this job needs (its grant, its events): fail it with the reason, stopping
    whatever runs. A finished job only loses a notification: nothing changes."""
    if job.state in TERMINAL_STATES:
        return Transition.unchanged(job, f"job already {job.state}")
    effects: tuple[Effect, ...] = ()
    if job.state in (JobState.RUNNING, JobState.ADMITTING):
        effects = (StopOn(job.workers, job.lease_epoch, "failed", checkpoint_first=False),
                   LeaseFact(LeaseEventKind.RELEASED, job.lease_epoch, job.executor_id or "", reason="failed"))
    reason = f"undeliverable: {fact.reason}"
    new = _leave_run(job, JobState.FAILED, now, reason=reason)
    event = EventDraft(JobEventKind.FAILED, new.state, job.state, reason=reason, epoch=job.lease_epoch or None,
                       executor_id=job.executor_id)
    return Transition(new, (event,), effects)


@dataclass(frozen=True)
class ForeignReport(Refusal):
    """A run report from an executor that does not hold the run: a forgery or a confused agent, refused visibly."""


def from_holder(job: Job | None, executor_id: str, epoch: int) -> ForeignReport | None:
    """A report about the current run counts only from one of its executors. The epoch is public (the job view
    shows it), so without this any executor could finish, fail or checkpoint another tenant's job under its own,
    honest, id. Other epochs and unknown jobs are left to ``decide`` (old news, not a forgery)."""
    if job is None or epoch != job.lease_epoch or not job.workers or executor_id in job.workers:
        return None
    return ForeignReport("a report from an executor that does not hold the job's lease",
                   {"executor_id": executor_id, "workers": list(job.workers), "epoch": epoch})


def on_run_fact(job: Job, fact: Started | StepReported | Checkpointed | CheckpointSkipped | StoreNoted | Finished
                | LeaseExpired, now: datetime) -> Transition:
    """Facts produced under a lease count only for the job's current run; anything else is old news (a zombie
    executor, a redelivered report, a race with cancel), never an error."""
    if fact.epoch != job.lease_epoch:
        return Transition.stale_epoch(job, fact.epoch)
    # A forming gang already reports (each worker starts, and rank 0 may step before the last ready arrives);
    # its lease expiry is not watched: the ready timeout ends a gang that cannot form.
    forming = job.state is JobState.ADMITTING and not isinstance(fact, LeaseExpired)
    if job.state is not JobState.RUNNING and not forming:
        return Transition.unchanged(job, f"job is {job.state}")
    if _stopped_at_ceiling(job, fact):
        # The executor stopped the run by its own clock before the budget's exhaustion reached us: the same
        # ceiling stop (the budget still reconciles, and its exhaustion then finds the job interrupted).
        job = evolve(job, stop_requested=CEILING_STOP)
    if job.gang and isinstance(fact, Finished):
        return gang.on_finished(job, fact, now, _attempt_failed,
                                      lambda j, epoch, at, detail: _interrupt(j, epoch, at, detail,
                                                                              _released(j, CEILING_STOP)))
    if job.gang and isinstance(fact, LeaseExpired):
        return gang.on_lease_expired(job, fact, now)
    ex = job.executor_id
    if isinstance(fact, Started):
        detail = {"resumed_from_step": fact.resumed_from_step, "resumed_from": fact.resumed_from,
                  "device": fact.device}
        if fact.confinement is not None:  # what holds the run on its host, and what does not (said plainly)
            detail["confinement"] = fact.confinement
        if fact.allocation is not None:  # a Slurm pilot's job, time left, and a ceiling it outlasts
            detail["allocation"] = fact.allocation
        # The run starts where its checkpoint was (None: from scratch), whatever the last run reached.
        new = evolve(job, last_step=fact.resumed_from_step, updated_at=now)
        return Transition(new, (EventDraft(JobEventKind.STARTED, job.state, job.state, epoch=fact.epoch,
                                           executor_id=ex, detail=detail),))
    if isinstance(fact, StepReported):
        return Transition(_with_step(job, fact, now))
    if isinstance(fact, Checkpointed):
        # Accepted from the current epoch's lease holder (checked above and in ``from_holder``): the epoch is kept
        # with it, and the next grant resumes from this one only (``resume_point``), never from a newer file.
        ckpt = {"step": fact.step, "path": fact.path, "sha256": fact.sha256, "bytes": fact.bytes,
                "at": fact.at.isoformat(), "epoch": fact.epoch, "kind": fact.kind}
        if fact.files is not None:
            ckpt["files"] = fact.files
        if fact.upload_seconds is not None:  # in the store (its manifest's address is the path)
            ckpt.update(state="stored", upload_seconds=round(fact.upload_seconds, 3))
        if fact.stored_bytes is not None:
            ckpt["stored_bytes"] = fact.stored_bytes
        new = evolve(job, last_checkpoint=ckpt, updated_at=now)
        return Transition(new, (EventDraft(JobEventKind.CHECKPOINTED, job.state, job.state, epoch=fact.epoch,
                                           executor_id=ex, detail=ckpt),))
    if isinstance(fact, CheckpointSkipped):
        return Transition(evolve(job, updated_at=now), (
            EventDraft(JobEventKind.CHECKPOINT_SKIPPED, job.state, job.state, reason=fact.reason, epoch=fact.epoch,
                       executor_id=ex, detail={"path": fact.path}),))
    if isinstance(fact, StoreNoted):
        # Seen, not accepted: a checkpoint uploading is not valid (the queue moves nothing), it only shows on the job.
        kind = (JobEventKind.CHECKPOINT_STORE_WAITING if fact.state == "waiting"
                else JobEventKind.CHECKPOINT_UPLOADING)
        return Transition(evolve(job, updated_at=now), (
            EventDraft(kind, job.state, job.state, reason=fact.detail.get("reason"), epoch=fact.epoch,
                       executor_id=ex, detail={k: v for k, v in fact.detail.items() if k != "reason"}),))
    if isinstance(fact, LeaseExpired):
        return _run_lost(job, JobEventKind.LEASE_EXPIRED, LeaseEventKind.EXPIRED, "lease expired", now)
    return _on_finished(job, fact, now)


def _stopped_at_ceiling(job: Job, fact: object) -> bool:
    return (isinstance(fact, Finished) and fact.outcome is RunOutcome.STOPPED and fact.stop_reason == CEILING_STOP
            and job.stop_requested is None)


def _on_finished(job: Job, fact: Finished, now: datetime) -> Transition:
    if fact.last_step is not None:
        job = evolve(job, last_step=fact.last_step)
    detail = {"outcome": fact.outcome.value, "exit_code": fact.exit_code, "last_step": fact.last_step}
    if fact.outcome is RunOutcome.SUCCEEDED:
        new = _leave_run(job, JobState.SUCCEEDED, now)
        return Transition(new, (EventDraft(JobEventKind.SUCCEEDED, new.state, job.state, epoch=fact.epoch,
                                           executor_id=job.executor_id, detail=detail),),
                          (_released(job, "succeeded"),))
    if job.stop_requested == CEILING_STOP:
        # The ceiling is reached whatever way the process ended: requeueing it would only overshoot further. The
        # label says how it ended (endings.py): a process that failed on its own failed, and spends its attempt.
        if endings.spends_attempt(fact):
            cause = AttemptCause.TRAINING_ERROR.value
            error = fact.error or (f"exit code {fact.exit_code}" if fact.exit_code is not None else "training failed")
            job = evolve(job, attempts={**job.attempts, cause: job.attempts.get(cause, 0) + 1}, error=error)
            detail = {**detail, "error": error}
        return _interrupt(job, fact.epoch, now, {**detail, "ceiling": True}, _released(job, CEILING_STOP),
                          reason=endings.interruption_reason(fact))
    preempted = preemption.preempted_run_ended(job, fact, now, _leave_run)
    if preempted is not None:
        return preempted
    if fact.outcome is RunOutcome.FAILED:
        return _attempt_failed(job, fact, now, detail)
    if fact.outcome is RunOutcome.HANDED_BACK:
        # Never started (the executor was busy or checking its node): free, and counted apart, so a transport
        # loss in the attempts is always a real one.
        return _run_lost(job, JobEventKind.ABANDONED, LeaseEventKind.RELEASED, f"handed back: {fact.error}", now,
                         {**detail, "error": fact.error}, cause=HANDED_BACK)
    if fact.outcome is RunOutcome.STOPPED and fact.stop_reason == HEALTH_CHECK_STOP:
        # The agent checkpointed and stopped it for an operator's forced health check: free, and its own cause,
        # so "transport loss" keeps meaning a lost contact.
        return _run_lost(job, JobEventKind.ABANDONED, LeaseEventKind.RELEASED, HEALTH_CHECK, now, detail,
                         cause=HEALTH_CHECK)
    # abandoned (the executor lost contact) or stopped without being asked: not the workload's fault.
    why = "abandoned" if fact.outcome is RunOutcome.ABANDONED else "stopped by executor"
    return _run_lost(job, JobEventKind.ABANDONED, LeaseEventKind.RELEASED, why, now, detail)


def _attempt_failed(job: Job, fact: Finished, now: datetime, detail: dict[str, Any]) -> Transition:
    cause = AttemptCause.TRAINING_ERROR.value
    attempts = {**job.attempts, cause: job.attempts.get(cause, 0) + 1}
    error = fact.error or (f"exit code {fact.exit_code}" if fact.exit_code is not None else "training failed")
    spent = attempts[cause]
    detail = {**detail, "error": error, "attempts_spent": spent, "max_attempts": job.spec.max_attempts}
    failed_event = EventDraft(JobEventKind.ATTEMPT_FAILED, JobState.RUNNING, JobState.RUNNING, reason=error,
                              epoch=fact.epoch, executor_id=job.executor_id, detail=detail)
    job = evolve(job, attempts=attempts, error=error)
    if spent >= job.spec.max_attempts:
        new = _leave_run(job, JobState.FAILED, now, reason=error)
        final = EventDraft(JobEventKind.FAILED, new.state, JobState.RUNNING, reason=error, epoch=fact.epoch,
                           executor_id=job.executor_id, detail={"attempts_spent": spent})
    else:
        new = _leave_run(job, JobState.QUEUED, now)
        final = EventDraft(JobEventKind.REQUEUED, new.state, JobState.RUNNING, reason=cause, epoch=fact.epoch,
                           detail={"attempts_spent": spent, "max_attempts": job.spec.max_attempts})
    return Transition(new, (failed_event, final), (_released(job, cause),))


def _run_lost(job: Job, kind: JobEventKind, lease_kind: LeaseEventKind, why: str, now: datetime,
              detail: dict[str, Any] | None = None, *, cause: str = TRANSPORT_LOST) -> Transition:
    """Contact with the run is lost (or the executor handed the grant back unstarted): free requeue counted
    under ``cause``, or interrupted when a ceiling stop was pending (the budget is spent, so the job must not run
    again without a new ceiling)."""
    lease = LeaseFact(lease_kind, job.lease_epoch, job.executor_id or "", reason=why)
    lost = EventDraft(kind, JobState.RUNNING, JobState.RUNNING, reason=why, epoch=job.lease_epoch,
                      executor_id=job.executor_id, detail=detail or {})
    if job.stop_requested == CEILING_STOP:
        reason = endings.LEASE_EXPIRED if kind is JobEventKind.LEASE_EXPIRED else (
            endings.HANDED_BACK if cause == HANDED_BACK else endings.ABANDONED)
        t = _interrupt(job, job.lease_epoch, now, {**(detail or {}), "ceiling": True}, lease, reason=reason)
        return replace(t, events=(lost, *t.events))
    attempts = {**job.attempts, cause: job.attempts.get(cause, 0) + 1}
    new = _leave_run(evolve(job, attempts=attempts), JobState.QUEUED, now)
    requeued = EventDraft(JobEventKind.REQUEUED, new.state, JobState.RUNNING, reason=cause,
                          epoch=job.lease_epoch, detail={cause: attempts[cause]})
    return Transition(new, (lost, requeued), (lease,))


def _interrupt(job: Job, epoch: int, now: datetime, detail: dict[str, Any], lease: LeaseFact, *,
               reason: str = CEILING_STOP) -> Transition:
    """Interrupted at the ceiling; ``reason``: how the run ended (endings.py), ``gpu_ceiling`` when it stopped."""
    new = _leave_run(job, JobState.INTERRUPTED, now, reason=reason)
    return Transition(new, (EventDraft(JobEventKind.INTERRUPTED, new.state, JobState.RUNNING, reason=reason,
                                       epoch=epoch, executor_id=job.executor_id, detail=detail),), (lease,))


def _released(job: Job, why: str) -> LeaseFact:
    return LeaseFact(LeaseEventKind.RELEASED, job.lease_epoch, job.executor_id or "", reason=why)


def _leave_run(job: Job, state: JobState, now: datetime, *, reason: str | None = None) -> Job:
    """The job stops holding executors (and, a gang, its reservations). A requeued job forgets its executor
    (it will get another); an ended one keeps it for the record."""
    return gang.leave(job, state, now, reason=reason)


def _with_step(job: Job, fact: StepReported, now: datetime) -> Job:
    """Steps update the job without an event (too frequent); the mean step time is weighted by the steps each
    report covers, so a report after a long gap counts for more than one after a short one."""
    mean, samples = job.step_seconds, job.step_samples
    if fact.step_seconds is not None:
        covered = max(1, fact.step - (job.last_step or 0))
        total = samples + covered
        mean = fact.step_seconds if mean is None else (mean * samples + fact.step_seconds * covered) / total
        samples = total
    return evolve(job, last_step=fact.step if job.last_step is None else max(fact.step, job.last_step),
                   total_steps=fact.total_steps if fact.total_steps is not None else job.total_steps,
                   step_seconds=mean, step_samples=samples, updated_at=now)
