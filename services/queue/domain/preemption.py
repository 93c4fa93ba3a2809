"""Preemption of borrowed capacity (tenancy): a running job is asked to checkpoint and stop so that another
organisation gets its nominal share back; when the run ends it is queued again, to resume from that checkpoint,
spending no attempt (counted under ``preempted``). The events say why and for whom.

A running gang is preempted the same way: every worker is told to stop, checkpoint first (rank 0 writes it), and
the gang is queued again once every worker has ended (``gang.on_finished``), like a ceiling stop; a worker lost
meanwhile is a node failure, as ever. A forming gang (admitting) is never preempted: it holds nothing trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from libs.contracts.jobs import AttemptCause, JobEventKind, JobState
from libs.contracts.leases import LeaseEventKind

from .facts import EventDraft, Finished, Job, LeaseFact, StopOn, Transition, evolve

PREEMPTED = AttemptCause.PREEMPTED.value


@dataclass(frozen=True)
class Preempt:
    for_org: str
    for_job: str
    reason: str


def on_preempt(job: Job, fact: Preempt, now: datetime) -> Transition:
    """Ask the run (each of its workers) to checkpoint and stop. Anything not running is left alone (a job that
    ended or is already stopping is old news: the placement pass that chose it saw an earlier state)."""
    if job.state is not JobState.RUNNING or not job.workers:
        return Transition.unchanged(job, f"only a running job is preempted; this one is {job.state}")
    if job.stop_requested is not None:
        return Transition.unchanged(job, f"a stop is already requested ({job.stop_requested})")
    new = evolve(job, stop_requested=PREEMPTED, updated_at=now)
    detail = {"for_org": fact.for_org, "for_job": fact.for_job, "org": job.org, "devices": job.devices,
              "node_group": job.node_group}
    event = EventDraft(JobEventKind.STOP_REQUESTED, new.state, job.state, reason=fact.reason, epoch=job.lease_epoch,
                       executor_id=job.executor_id, detail=detail)
    return Transition(new, (event,), (StopOn(job.workers, job.lease_epoch, PREEMPTED, checkpoint_first=True),))


def preempted_run_ended(job: Job, fact: Finished, now: datetime, leave) -> Transition | None:  # noqa: ANN001
    """The run of a job being preempted ended: queued again for free (None: not a preemption's end, the
    ordinary rules apply, e.g. a run that succeeded before it could stop)."""
    if job.stop_requested != PREEMPTED or fact.outcome.value == "succeeded":
        return None
    job = evolve(job, last_step=fact.last_step if fact.last_step is not None else job.last_step)
    return requeue(job, fact.epoch, now, leave, {"outcome": fact.outcome.value, "last_step": fact.last_step})


def requeue(job: Job, epoch: int, now: datetime, leave, detail: dict) -> Transition:  # noqa: ANN001
    """The preempted run is over (a single worker's, or every worker of a gang): queued again, spending no
    attempt, to resume from its last checkpoint (kept)."""
    attempts = {**job.attempts, PREEMPTED: job.attempts.get(PREEMPTED, 0) + 1}
    new = leave(evolve(job, attempts=attempts), JobState.QUEUED, now)
    detail = {**detail, PREEMPTED: attempts[PREEMPTED], "resume_from": (job.last_checkpoint or {}).get("step")}
    event = EventDraft(JobEventKind.REQUEUED, new.state, JobState.RUNNING, reason=PREEMPTED, epoch=epoch,
                       executor_id=job.executor_id, detail=detail)
    return Transition(new, (event,), (LeaseFact(LeaseEventKind.RELEASED, job.lease_epoch, job.executor_id or "",
                                                reason=PREEMPTED),))
