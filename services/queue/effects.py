"""What a transition's effects become on the wire: RunJob and StopJob to executor agents, LeaseEvents, and the
applying of a fact to a stored job (load under a row lock, decide, write) shared by every edge."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime

import asyncpg

from libs.contracts.agents import RunJob, StopJob
from libs.contracts.commands import Command, CommandOutcome
from libs.contracts.envelope import Envelope
from libs.contracts.leases import LeaseEvent
from libs.runtime.outbox import QuarantineHook

from . import store
from .domain.lifecycle import (Fact, Job, LeaseFact, Refusal, RunOn, StopOn, Transition, Undeliverable, decide,
                               from_holder)
from .domain.resume import resume_point
from .settings import QueueSettings

log = logging.getLogger(__name__)
SERVICE = "queue"


def messages_for(job: Job, transition: Transition, settings: QueueSettings,
                 remaining: float | None = None, *, trusted: bool = False,
                 checkpoint_quota: int | None = None) -> list[tuple[str, Envelope]]:
    """The outbox messages a transition's effects ask for (its job events are added by the store);
    ``remaining``: the job's GPU-seconds left, carried by its grants (None: unknown); ``checkpoint_quota``: the
    job's checkpoint quota capped by its organisation's (None: the agent applies the spec's). ``trusted``: every value is
    the queue's own or a stored job's, already validated (a placement pass's grants): the messages are made
    without validating them again (``Envelope.trusted``)."""
    subjects = settings.subjects
    out: list[tuple[str, Envelope]] = []
    run_job = RunJob.trusted if trusted else RunJob
    lease_event = LeaseEvent.trusted if trusted else LeaseEvent
    for effect in transition.effects:
        if isinstance(effect, RunOn):
            resume = resume_point(job.last_checkpoint)
            for rank, executor_id in enumerate(effect.workers):
                run = run_job(job_id=job.id, epoch=effect.epoch, executor_id=executor_id, spec=job.spec,
                             attempt=effect.attempt, lease_seconds=settings.lease_seconds,
                             heartbeat_seconds=settings.heartbeat_seconds, rank=rank,
                             world_size=len(effect.workers), rendezvous=job.rendezvous,
                             ready_timeout_seconds=_ready_timeout(job), remaining_gpu_seconds=remaining,
                             checkpoint_quota_bytes=checkpoint_quota, resume_from=resume)
                out.append((subjects.agent(executor_id, "run"), run))
        elif isinstance(effect, StopOn):
            for executor_id in effect.workers:
                stop = StopJob(job_id=job.id, epoch=effect.epoch, reason=effect.reason,
                               checkpoint_first=effect.checkpoint_first, grace_seconds=settings.stop_grace_seconds)
                out.append((subjects.agent(executor_id, "stop"), stop))
        elif isinstance(effect, LeaseFact):
            lease = lease_event(job_id=job.id, epoch=effect.epoch, executor_id=effect.executor_id,
                               event=effect.event, expires_at=effect.expires_at, reason=effect.reason)
            out.append((subjects.lease(job.id, effect.event.value), lease))
    return out


def answer_of(cmd: Command, job_id: str, result: Transition | Refusal) -> CommandOutcome:
    """The outcome a command about a job is answered with: accepted, or refused with the reason and numbers."""
    if isinstance(result, Refusal):
        return CommandOutcome(command_id=cmd.command_id, kind=cmd.KIND, accepted=False, reason=result.reason,
                              detail=result.detail or {}, job_id=job_id, by=SERVICE)
    return CommandOutcome(command_id=cmd.command_id, kind=cmd.KIND, accepted=True, job_id=job_id, by=SERVICE)


def _ready_timeout(job: Job) -> float | None:
    if job.ready_deadline is None or job.admitted_at is None:
        return None
    return max(0.001, (job.ready_deadline - job.admitted_at).total_seconds())


def job_of(payload: bytes) -> str | None:
    """The job a stored outbox message is about (every queue message names its ``job_id``, outcomes too)."""
    try:
        value = json.loads(payload)
    except ValueError:
        return None
    job_id = value.get("job_id") if isinstance(value, dict) else None
    return job_id if isinstance(job_id, str) and job_id else None


def quarantine_hook(settings: QueueSettings, clock: Callable[[], datetime]) -> QuarantineHook:
    """What the queue does when the bus refuses one of its messages for good: the job it was about fails with
    the reason (in the relay's transaction), so it never cycles through grants no executor receives."""

    async def hook(conn: asyncpg.Connection, subject: str, payload: bytes, reason: str) -> None:
        job_id = job_of(payload)
        if job_id is not None:
            await apply(conn, settings, job_id, Undeliverable(reason), clock())

    return hook


async def apply(conn: asyncpg.Connection, settings: QueueSettings, job_id: str, fact: Fact,
                now: datetime, *, reporter: str | None = None) -> Transition | Refusal:
    """Load the job under a row lock, decide, and write what changed; the caller holds the transaction.
    ``reporter``: the executor a run report comes from, refused unless it holds the run it reports on."""
    job = await store.load_job(conn, job_id, lock=True)
    if reporter is not None and (refusal := from_holder(job, reporter, fact.epoch)) is not None:
        return refusal
    result = decide(job, fact, now)
    if isinstance(result, Transition) and result.changed:
        await store.write(conn, settings.subjects, result, now, messages_for(result.job, result, settings),
                          new=job is None)
    return result
