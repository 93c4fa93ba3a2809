"""The words of the job lifecycle: the job as the queue holds it, the facts that can happen to it, and what a
decision yields (a transition with events and effects, or a refusal). The rules are in ``lifecycle``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from libs.contracts.jobs import AttemptCause, JobEventKind, JobSpec, JobState
from libs.contracts.leases import LeaseEventKind
from libs.contracts.telemetry import RunOutcome

from .gang_admission import Backoff


def no_attempts() -> dict[str, int]:
    return {cause.value: 0 for cause in AttemptCause}


@dataclass(frozen=True)
class GangWorker:
    """One worker of a gang's current run (jobs with ``workers > 1``; rank = position in ``Job.gang``)."""

    executor_id: str
    lease_expires_at: datetime | None = None  # each worker renews its own lease; the job's is the earliest
    ready_at: datetime | None = None  # its process group formed (WorkerReady)
    ended: str | None = None  # how its process ended (a RunOutcome value, or "peer_lost"); None while running


@dataclass(frozen=True)
class Job:
    id: str
    name: str
    owner: str
    spec: JobSpec
    state: JobState
    created_at: datetime
    updated_at: datetime
    attempts: dict[str, int] = field(default_factory=no_attempts)  # by AttemptCause value
    attempt_number: int = 0  # grants so far
    lease_epoch: int = 0  # epoch of the latest grant (the fencing token)
    executor_id: str | None = None  # rank 0 of the current (or last, once ended) run
    workers: tuple[str, ...] = ()  # every executor of the current run, rank order
    lease_expires_at: datetime | None = None
    last_step: int | None = None
    total_steps: int | None = None
    step_seconds: float | None = None  # mean wall time per step, weighted by steps measured
    step_samples: int = 0  # steps behind step_seconds
    last_checkpoint: dict[str, Any] | None = None
    reason: str | None = None
    error: str | None = None
    stop_requested: str | None = None  # reason of a stop sent to the executor and not yet answered
    ceiling_history: tuple[dict[str, Any], ...] = ()
    event_seq: int = 0  # owned by the store: the seq of the last event written
    # -- gangs (workers > 1); see gang.py
    gang: tuple[GangWorker, ...] = ()  # the workers of the current run, rank order; () when not admitted
    rendezvous: str | None = None  # host:port of rank 0's store for the current run
    ready_deadline: datetime | None = None  # admitting: every worker ready by then, or the job backs off
    admitted_at: datetime | None = None  # the current run's grant (admitting began)
    backoff_count: int = 0  # ready timeouts so far
    next_admission_at: datetime | None = None  # backoff: when it is queued again
    on_node_failure: str = "requeue_gang"  # the policy's strategy when the run was admitted
    # -- tenancy (services/queue/tenancy)
    org: str = "default"
    project: str = "default"
    priority: int = 0  # within its organisation: higher first
    node_group: str | None = None  # the node group of its current (or last) run's nodes
    devices: int = 0  # what its current run holds against its organisation's quota


# -- facts ------------------------------------------------------------------------------------------------

_JOB_FIELDS = frozenset(Job.__dataclass_fields__)


def evolve(job: Job, **changes: Any) -> Job:
    """``dataclasses.replace`` for a Job, about ten times cheaper (a copy of its fields, not its generated
    ``__init__`` setting 35 frozen fields one by one): every transition makes one or two, a placement pass two per
    grant. Job has no ``__post_init__`` to run; a name that is not a field is refused, as ``replace`` does."""
    unknown = changes.keys() - _JOB_FIELDS
    if unknown:
        raise TypeError(f"Job has no field(s) {', '.join(sorted(unknown))}")
    new = object.__new__(Job)
    new.__dict__.update(job.__dict__)
    new.__dict__.update(changes)
    return new


_JOB_ORDER = tuple(Job.__dataclass_fields__)


def made(values: dict[str, Any]) -> Job:
    """A Job from every field's value (a stored row), as ``Job(**values)`` makes it at about half the cost (the
    generated ``__init__`` sets 35 frozen fields one by one; a placement pass reads 200 jobs whole). Job has no
    ``__post_init__``; a missing or unknown name is refused, as the constructor does."""
    if values.keys() != _JOB_FIELDS:
        raise TypeError(f"Job fields missing {sorted(_JOB_FIELDS - values.keys())}, "
                        f"unknown {sorted(values.keys() - _JOB_FIELDS)}")
    new = object.__new__(Job)
    new.__dict__.update({name: values[name] for name in _JOB_ORDER})
    return new


@dataclass(frozen=True)
class Submitted:
    job_id: str
    name: str
    owner: str
    spec: JobSpec
    org: str = "default"


@dataclass(frozen=True)
class Granted:
    workers: tuple[str, ...]  # rank order; workers[0] is the executor the job is shown on
    epoch: int
    expires_at: datetime
    # gangs only: where the workers meet, by when they must be ready, what a node failure will do
    rendezvous: str | None = None
    ready_deadline: datetime | None = None
    on_node_failure: str = "requeue_gang"


@dataclass(frozen=True)
class Renew:
    executor_id: str
    epoch: int
    expires_at: datetime


@dataclass(frozen=True)
class Started:
    epoch: int
    resumed_from_step: int | None = None
    resumed_from: str | None = None
    device: str = "cpu"
    confinement: dict | None = None  # the run's limits and filter, as the executor says they hold on its host
    allocation: dict | None = None  # the batch scheduler's allocation it runs in (a Slurm pilot), with warnings


@dataclass(frozen=True)
class StepReported:
    epoch: int
    step: int
    total_steps: int | None = None
    step_seconds: float | None = None


@dataclass(frozen=True)
class Checkpointed:
    epoch: int
    step: int
    path: str
    at: datetime
    sha256: str | None = None
    bytes: int | None = None
    kind: str = "file"  # or "directory" (CheckpointKind)
    files: int | None = None
    upload_seconds: float | None = None  # with a store: report to manifest stored
    stored_bytes: int | None = None  # with a store: what the job's stored checkpoints hold after its retention


@dataclass(frozen=True)
class CheckpointSkipped:
    epoch: int
    path: str
    reason: str


@dataclass(frozen=True)
class StoreNoted:
    """The checkpoint store's side of the run: ``state`` uploading or waiting, what it says in ``detail``."""

    epoch: int
    state: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class Finished:
    epoch: int
    outcome: RunOutcome
    exit_code: int | None = None
    error: str | None = None
    last_step: int | None = None
    executor_id: str | None = None  # which worker's process ended (gangs track each one)
    stop_reason: str | None = None  # stopped: why (gpu_ceiling: the executor's own clock may come first)


@dataclass(frozen=True)
class LeaseExpired:
    epoch: int


@dataclass(frozen=True)
class Cancel:
    reason: str
    actor: str


@dataclass(frozen=True)
class StopForCeiling:
    ceiling_seconds: float
    consumed_seconds: float


@dataclass(frozen=True)
class Requeue:
    new_ceiling: float
    consumed: float
    actor: str


@dataclass(frozen=True)
class WorkerReady:
    """A gang worker's process group formed."""

    epoch: int
    executor_id: str


@dataclass(frozen=True)
class ReadyTimedOut:
    """The scanner saw an admitting gang past its ready deadline; ``backoff`` is the next back-off the policy
    allows (None: the limit is used up and the job fails)."""

    epoch: int
    backoff: Backoff | None


@dataclass(frozen=True)
class NodeFailed:
    """The health service says this executor's node failed (or is being recovered or replaced)."""

    executor_id: str
    reason: str


@dataclass(frozen=True)
class AdmissionDue:
    """A job in backoff whose time has come (the scanner asks; the job knows when)."""


@dataclass(frozen=True)
class Undeliverable:
    """A message about this job can never be published (the bus refused it: over its max payload, say), so the
    job cannot go on: it fails with that reason rather than cycling through grants nobody receives."""

    reason: str


Fact = (Submitted | Granted | Renew | Started | StepReported | Checkpointed | CheckpointSkipped | StoreNoted | Finished
        | LeaseExpired | Cancel | StopForCeiling | Requeue | WorkerReady | ReadyTimedOut | AdmissionDue
        | NodeFailed | Undeliverable)
RUN_FACTS = (Started, StepReported, Checkpointed, CheckpointSkipped, StoreNoted, Finished, LeaseExpired)


# -- results ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EventDraft:
    """A job event before the store gives it its sequence number."""

    event: JobEventKind
    state: JobState
    previous_state: JobState | None
    reason: str | None = None
    epoch: int | None = None
    executor_id: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunOn:
    """Send RunJob to every worker (rank = position)."""

    workers: tuple[str, ...]
    epoch: int
    attempt: int


@dataclass(frozen=True)
class StopOn:
    """Send StopJob to every worker of the run with this epoch."""

    workers: tuple[str, ...]
    epoch: int
    reason: str
    checkpoint_first: bool


@dataclass(frozen=True)
class LeaseFact:
    """Publish a LeaseEvent."""

    event: LeaseEventKind
    epoch: int
    executor_id: str
    expires_at: datetime | None = None
    reason: str | None = None


Effect = RunOn | StopOn | LeaseFact


@dataclass(frozen=True)
class Transition:
    job: Job
    events: tuple[EventDraft, ...] = ()
    effects: tuple[Effect, ...] = ()
    ignored: str | None = None  # why the fact changed nothing (stale epoch, run over); None when applied
    stale: bool = False  # ignored because it came under an older lease epoch (counted against its sender)

    @classmethod
    def unchanged(cls, job: Job, ignored: str | None = None) -> Transition:
        return cls(job=job, ignored=ignored)

    @classmethod
    def stale_epoch(cls, job: Job, epoch: int) -> Transition:
        """Old news from a lease the job no longer has (a zombie executor, a redelivered report)."""
        return cls(job=job, ignored=f"stale epoch {epoch} (current {job.lease_epoch})", stale=True)

    @property
    def changed(self) -> bool:
        return self.ignored is None


@dataclass(frozen=True)
class Refusal:
    """The fact is not allowed in the job's state; ``detail`` carries the numbers behind the reason."""

    reason: str
    detail: dict[str, Any] = field(default_factory=dict)
