"""The GPU ceiling in a job's lifecycle: the stop when the budget says it is reached (``on_ceiling``), and the
requeue of an interrupted job with a new total ceiling that leaves room to run (``on_requeue``). Pure; ``decide``
(lifecycle.py) routes ``StopForCeiling`` and ``Requeue`` here. What a run's end does to a job whose ceiling stop
is pending is the run facts' (lifecycle.py ``_on_finished``, ``_run_lost``).
"""

from __future__ import annotations

from datetime import datetime

from libs.contracts.jobs import TERMINAL_STATES, JobEventKind, JobState
from libs.contracts.leases import LeaseEventKind

from . import gang
from .endings import CEILING_STOP
from .facts import EventDraft, Job, LeaseFact, Refusal, Requeue, StopForCeiling, StopOn, Transition, evolve

REQUEUE_MARGIN_SECONDS = 60.0  # a requeue must leave at least this many GPU-seconds to run (DESIGN.md 5)


def on_requeue(job: Job, fact: Requeue, now: datetime) -> Transition | Refusal:
    """Only an interrupted job is requeued, and only with room for at least a minute more of work."""
    if job.state is not JobState.INTERRUPTED:
        return Refusal(f"only an interrupted job can be requeued; this job is {job.state}",
                       {"state": job.state.value})
    minimum = fact.consumed + REQUEUE_MARGIN_SECONDS
    if fact.new_ceiling < minimum:
        return Refusal(f"new ceiling {fact.new_ceiling:g}s is below consumed + {REQUEUE_MARGIN_SECONDS:g}s "
                       f"= {minimum:g}s",
                       {"consumed_seconds": fact.consumed, "minimum_seconds": minimum,
                        "given_seconds": fact.new_ceiling})
    previous = job.spec.gpu_ceiling_seconds
    entry = {"ceiling_seconds": fact.new_ceiling, "actor": fact.actor, "at": now.isoformat()}
    spec = job.spec.model_copy(update={"gpu_ceiling_seconds": fact.new_ceiling})
    new = evolve(job, state=JobState.QUEUED, spec=spec, ceiling_history=(*job.ceiling_history, entry), reason=None,
                  stop_requested=None, executor_id=None, updated_at=now)
    event = EventDraft(JobEventKind.REQUEUED, new.state, job.state, reason="ceiling_raised",
                       detail={"gpu_ceiling_seconds": fact.new_ceiling, "previous_ceiling_seconds": previous,
                               "consumed_seconds": fact.consumed, "actor": fact.actor})
    return Transition(new, (event,))


def on_ceiling(job: Job, fact: StopForCeiling, now: datetime) -> Transition:
    """The budget says the ceiling is reached. A running job is asked to checkpoint and stop; it becomes
    interrupted when the executor reports the stop (or its lease expires). A job not running is interrupted at
    once. An exhaustion of a ceiling lower than the job's current one predates a requeue: old news."""
    if job.state in TERMINAL_STATES or job.state is JobState.INTERRUPTED:
        return Transition.unchanged(job, f"job is {job.state}")
    if fact.ceiling_seconds < job.spec.gpu_ceiling_seconds:
        return Transition.unchanged(job, "exhaustion of an earlier ceiling")
    numbers = {"ceiling_seconds": fact.ceiling_seconds, "consumed_seconds": fact.consumed_seconds}
    if job.state is JobState.ADMITTING:
        # A gang still forming has trained nothing yet: stop its workers and interrupt it at once.
        new = gang.leave(job, JobState.INTERRUPTED, now, reason=CEILING_STOP)
        return Transition(new, (EventDraft(JobEventKind.INTERRUPTED, new.state, job.state, reason=CEILING_STOP,
                                           detail=numbers),),
                          (StopOn(job.workers, job.lease_epoch, CEILING_STOP, checkpoint_first=False),
                           _released(job)))
    if job.state is not JobState.RUNNING:
        new = gang.leave(job, JobState.INTERRUPTED, now, reason=CEILING_STOP)
        return Transition(new, (EventDraft(JobEventKind.INTERRUPTED, new.state, job.state, reason=CEILING_STOP,
                                           detail=numbers),))
    if job.stop_requested == CEILING_STOP:
        return Transition.unchanged(job, "stop already requested")
    new = evolve(job, stop_requested=CEILING_STOP, updated_at=now)
    event = EventDraft(JobEventKind.STOP_REQUESTED, new.state, job.state, reason=CEILING_STOP,
                       epoch=job.lease_epoch, executor_id=job.executor_id, detail=numbers)
    return Transition(new, (event,), (StopOn(job.workers, job.lease_epoch, CEILING_STOP, checkpoint_first=True),))


def _released(job: Job) -> LeaseFact:
    return LeaseFact(LeaseEventKind.RELEASED, job.lease_epoch, job.executor_id or "", reason=CEILING_STOP)
