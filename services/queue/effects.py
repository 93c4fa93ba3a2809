"""What a transition's effects become on the wire: RunJob and StopJob to executor agents, LeaseEvents, and the
applying of a fact to a stored job (load under a row lock, decide, write) shared by every edge."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from libs.contracts.agents import RunJob, StopJob
from libs.contracts.envelope import Envelope
from libs.contracts.leases import LeaseEvent

from . import store
from .domain.lifecycle import Fact, Job, LeaseFact, Refusal, RunOn, StopOn, Transition, decide
from .settings import QueueSettings

log = logging.getLogger(__name__)


def messages_for(job: Job, transition: Transition, settings: QueueSettings) -> list[tuple[str, Envelope]]:
    """The outbox messages a transition's effects ask for (its job events are added by the store)."""
    subjects = settings.subjects
    out: list[tuple[str, Envelope]] = []
    for effect in transition.effects:
        if isinstance(effect, RunOn):
            for rank, executor_id in enumerate(effect.workers):
                run = RunJob(job_id=job.id, epoch=effect.epoch, executor_id=executor_id, spec=job.spec,
                             attempt=effect.attempt, lease_seconds=settings.lease_seconds,
                             heartbeat_seconds=settings.heartbeat_seconds, rank=rank,
                             world_size=len(effect.workers), rendezvous=job.rendezvous,
                             ready_timeout_seconds=_ready_timeout(job))
                out.append((subjects.agent(executor_id, "run"), run))
        elif isinstance(effect, StopOn):
            for executor_id in effect.workers:
                stop = StopJob(job_id=job.id, epoch=effect.epoch, reason=effect.reason,
                               checkpoint_first=effect.checkpoint_first, grace_seconds=settings.stop_grace_seconds)
                out.append((subjects.agent(executor_id, "stop"), stop))
        elif isinstance(effect, LeaseFact):
            lease = LeaseEvent(job_id=job.id, epoch=effect.epoch, executor_id=effect.executor_id,
                               event=effect.event, expires_at=effect.expires_at, reason=effect.reason)
            out.append((subjects.lease(job.id, effect.event.value), lease))
    return out


def _ready_timeout(job: Job) -> float | None:
    if job.ready_deadline is None or job.admitted_at is None:
        return None
    return max(0.001, (job.ready_deadline - job.admitted_at).total_seconds())


@dataclass
class StaleFacts:
    """Facts ignored because they came from an older lease epoch: counted, and logged once per executor so a
    zombie executor cannot flood the log."""

    count: int = 0
    logged: set[str] = field(default_factory=set)

    def note(self, executor_id: str, job_id: str, why: str) -> None:
        self.count += 1
        if executor_id not in self.logged:
            self.logged.add(executor_id)
            log.warning("ignoring messages from executor %s about job %s: %s (logged once per executor)",
                        executor_id, job_id, why)


async def apply(conn: asyncpg.Connection, settings: QueueSettings, job_id: str, fact: Fact,
                now: datetime) -> Transition | Refusal:
    """Load the job under a row lock, decide, and write what changed; the caller holds the transaction."""
    job = await store.load_job(conn, job_id, lock=True)
    result = decide(job, fact, now)
    if isinstance(result, Transition) and result.changed:
        await store.write(conn, settings.subjects, result, now, messages_for(result.job, result, settings),
                          new=job is None)
    return result
