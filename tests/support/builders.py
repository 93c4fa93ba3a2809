"""Builders for the objects tests make over and over (Kueue's testing wrappers, as keyword functions): job specs,
the queue's job record and the facts that happen to it, the contracts executors and nodes send, health's node,
check-run rows and evaluator readings, and the placement's inputs (organisations, pending and running jobs,
executor nodes, the snapshot, candidates, gang admission's view).

Each builder returns a valid object with defaults any test may rely on, and takes the object's own field names as
overrides (``job(JobState.RUNNING, last_step=40)``, ``heartbeat("ex-2", accepting=False)``). The defaults name one
small world: job ``j1`` owned by ``ann``, executor ``ex-1`` on node ``node-ex-1`` in group ``g``, at ``T0``, in its
third grant (``EPOCH``), so a test can speak of an older epoch without setting one up.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from libs.contracts.agents import RunJob
from libs.contracts.commands import SubmitJob
from libs.contracts.jobs import CommandWorkload, FinetuneWorkload, JobEvent, JobEventKind, JobSpec, JobState
from libs.contracts.nodes import CheckReport, CheckStatus, CheckTest, NodeRegistered, NodeState
from libs.contracts.telemetry import (CheckpointReport, Heartbeat, RunFinished, RunOutcome, RunStarted,
                                      StepReport)
from services.health.domain.nodes import Node
from services.health.domain.runs import Member, MemberStatus, Result
from services.queue.domain.facts import Checkpointed, Finished, GangWorker, Granted, Job, Started, StepReported
from services.queue.domain.gang_admission import QueuedJob
from services.queue.tenancy import placement_types
from services.queue.tenancy.candidates import Candidate
from services.queue.tenancy.model import GroupQuota, Organisation, Pending, Running
from services.queue.tenancy.placement_types import Snapshot

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
JOB = "j1"
OWNER = "ann"
EX = "ex-1"
EPOCH = 3  # the job's third grant: epochs 1 and 2 are stale
LEASE = timedelta(seconds=6)
GROUP = "g"
GANG = ("w0", "w1", "w2")  # a gang's executors, rank order
READY_WITHIN = timedelta(seconds=30)  # an admitting gang's workers must be ready by admission + this
ORG = "o"  # the placement's one organisation, unmetered unless a test gives it quotas


# -- jobs ---------------------------------------------------------------------------------------------------

def spec(**overrides: Any) -> JobSpec:
    """A fine-tune with the contract's defaults; ``workload`` may be a model or its dict."""
    return JobSpec.model_validate({"workload": FinetuneWorkload(), **overrides})


def command_spec(*argv: str, env: dict[str, str] | None = None, **overrides: Any) -> JobSpec:
    """A command job running ``argv`` (``true`` by default) with ``env`` added to its environment."""
    return spec(workload=CommandWorkload(command=list(argv or ("true",)), env=env or {}), **overrides)


def job(state: JobState = JobState.QUEUED, *, epoch: int = EPOCH, at: datetime = T0, **overrides: Any) -> Job:
    """The queue's record of job ``j1`` in ``state`` after ``epoch`` grants, last changed ``at``: a running job
    holds a lease on ``ex-1`` until ``at + LEASE``; an admitting one is a gang of two (``ex-1``, ``ex-2``) waiting
    for its workers to be ready. Its spec (a fine-tune with a 600 s GPU ceiling unless ``spec`` is given) gets
    ``workers=2`` when admitting. Any other field of ``Job`` is an override."""
    job_spec = overrides.pop("spec", None) or spec(gpu_ceiling_seconds=600)
    lease = at + LEASE
    values: dict[str, Any] = dict(id=JOB, name="demo", owner=OWNER, spec=job_spec, state=state, created_at=at,
                                  updated_at=at, lease_epoch=epoch, attempt_number=epoch)
    if state is JobState.RUNNING:
        values.update(executor_id=EX, workers=(EX,), lease_expires_at=lease)
    elif state is JobState.ADMITTING:  # only a gang is ever admitting
        values.update(executor_id=EX, workers=(EX, "ex-2"), lease_expires_at=lease,
                      gang=(GangWorker(EX, lease), GangWorker("ex-2", lease)), ready_deadline=at + timedelta(days=60),
                      spec=job_spec.model_copy(update={"workers": 2}))
    values.update(overrides)
    return Job(**values)


def gang_job(state: JobState = JobState.ADMITTING, *, workers: tuple[str, ...] = GANG, ready: int = 0,
             ended: dict[int, str] | None = None, epoch: int = EPOCH, at: datetime = T0, **overrides: Any) -> Job:
    """Gang ``g1`` (a fine-tune of ``len(workers)`` workers, 600 s GPU ceiling) admitted ``at`` under ``epoch``.
    Admitting or running, every worker holds a lease until ``at + LEASE``, the first ``ready`` ranks are ready,
    ``ended`` says how a rank's process ended, and rank 0's store is the rendezvous; admitting, its workers must
    be ready by ``at + READY_WITHIN``; in backoff it is admitted again then."""
    job_spec = spec(workers=len(workers), gpu_ceiling_seconds=600)
    holds = state in (JobState.ADMITTING, JobState.RUNNING)
    lease, deadline = at + LEASE, at + READY_WITHIN
    gang = tuple(GangWorker(e, lease, ready_at=at if rank < ready else None, ended=(ended or {}).get(rank))
                 for rank, e in enumerate(workers)) if holds else ()
    values: dict[str, Any] = dict(
        id="g1", name="gang", owner=OWNER, spec=job_spec, state=state, created_at=at, updated_at=at,
        lease_epoch=epoch, attempt_number=epoch, executor_id=workers[0] if holds else None,
        workers=workers if holds else (), gang=gang, lease_expires_at=lease if holds else None,
        rendezvous="127.0.0.1:29501" if holds else None,
        ready_deadline=deadline if state is JobState.ADMITTING else None, admitted_at=at,
        next_admission_at=deadline if state is JobState.BACKOFF else None)
    values.update(overrides)
    return Job(**values)


def submit(job_spec: JobSpec | None = None, **overrides: Any) -> SubmitJob:
    """``ann`` submitting ``job_spec`` (a default fine-tune) as a new job."""
    return SubmitJob(**{"actor": OWNER, "spec": job_spec or spec(), **overrides})


def job_event(event: JobEventKind | str = JobEventKind.SUBMITTED, state: JobState = JobState.QUEUED, *, seq: int = 1,
              **overrides: Any) -> JobEvent:
    """Event ``seq`` of job ``j1``, made at ``T0 + seq`` seconds unless ``time`` is given."""
    return JobEvent(**{"job_id": JOB, "seq": seq, "event": event, "state": state,
                       "time": T0 + timedelta(seconds=seq), **overrides})


# -- the queue's facts ----------------------------------------------------------------------------------------

def granted(*workers: str, epoch: int = EPOCH + 1, expires_at: datetime | None = None, **overrides: Any) -> Granted:
    """A grant of the next epoch to ``workers`` (``ex-1`` alone by default) with a lease of ``LEASE`` from T0."""
    return Granted(workers or (EX,), epoch, expires_at or T0 + LEASE, **overrides)


def started(epoch: int = EPOCH, **overrides: Any) -> Started:
    return Started(epoch, **overrides)


def step_reported(step: int, *, epoch: int = EPOCH, **overrides: Any) -> StepReported:
    return StepReported(epoch, step, **overrides)


def checkpointed(step: int, *, epoch: int = EPOCH, at: datetime = T0, **overrides: Any) -> Checkpointed:
    """A checkpoint of ``step`` at ``/ckpt/step-<step>.pt``."""
    return Checkpointed(**{"epoch": epoch, "step": step, "path": f"/ckpt/step-{step}.pt", "at": at, **overrides})


def finished(outcome: RunOutcome = RunOutcome.SUCCEEDED, *, epoch: int = EPOCH, **overrides: Any) -> Finished:
    return Finished(epoch, outcome, **overrides)


# -- executors ------------------------------------------------------------------------------------------------

def grant(job_spec: JobSpec | None = None, **overrides: Any) -> RunJob:
    """The queue's first grant of ``j1`` (epoch 1) to ``ex-1``: a command job running ``true`` by default."""
    return RunJob(**{"job_id": JOB, "epoch": 1, "executor_id": EX, "attempt": 1, "lease_seconds": 6,
                     "heartbeat_seconds": 1, "spec": job_spec or command_spec(), **overrides})


def heartbeat(executor: str = EX, **overrides: Any) -> Heartbeat:
    """An idle executor's heartbeat from ``node-<executor>`` in group ``g``, sent at T0, every 30 s."""
    return Heartbeat(**{"executor_id": executor, "node_id": f"node-{executor}", "group": GROUP, "sent_at": T0,
                        "interval_seconds": 30, "progress_interval_seconds": 30, **overrides})


def step_report(step: int, *, epoch: int = 1, **overrides: Any) -> StepReport:
    return StepReport(**{"job_id": JOB, "epoch": epoch, "executor_id": EX, "step": step, **overrides})


def checkpoint_report(step: int, *, epoch: int = 1, **overrides: Any) -> CheckpointReport:
    return CheckpointReport(**{"job_id": JOB, "epoch": epoch, "executor_id": EX, "step": step,
                               "path": f"/ckpt/step-{step}.pt", **overrides})


def run_started(*, epoch: int = 1, **overrides: Any) -> RunStarted:
    return RunStarted(**{"job_id": JOB, "epoch": epoch, "executor_id": EX, **overrides})


def run_finished(outcome: RunOutcome = RunOutcome.SUCCEEDED, *, epoch: int = 1, **overrides: Any) -> RunFinished:
    return RunFinished(**{"job_id": JOB, "epoch": epoch, "executor_id": EX, "outcome": outcome, **overrides})


# -- nodes ----------------------------------------------------------------------------------------------------

def registration(executor: str = EX, **overrides: Any) -> NodeRegistered:
    """``executor``'s agent registering node ``node-<executor>`` of group ``g`` (one CPU, no GPU)."""
    return NodeRegistered(**{"node_id": f"node-{executor}", "executor_id": executor, "group": GROUP,
                             "hostname": f"host-{executor}", "cpu_count": 1, "agent_version": "test", **overrides})


def node(state: NodeState = NodeState.READY, **overrides: Any) -> Node:
    """Health's record of node ``n1`` (executor ``e1``, group ``g``, boot ``b1``) in ``state``; a checking node is
    in check run ``r1``."""
    return Node(**{"node_id": "n1", "group": GROUP, "executor_id": "e1", "state": state, "boot_id": "b1",
                   "run_id": "r1" if state is NodeState.CHECKING else None, **overrides})


def check_report(status: CheckStatus | str = CheckStatus.PASSED, test: CheckTest | None = CheckTest.MATMUL,
                 **overrides: Any) -> CheckReport:
    """Node ``n1``'s (executor ``e1``) report of ``test`` in check run ``r1``."""
    return CheckReport(**{"run_id": "r1", "node_id": "n1", "executor_id": "e1", "test": test, "status": status,
                          **overrides})


# -- health's check runs and signal evaluator -------------------------------------------------------------------

def member(status: MemberStatus = MemberStatus.WAITING, **overrides: Any) -> Member:
    """Node ``n1``'s place in check run ``r1``: waiting has no wave nor deadline; a started member is in wave 1
    with a deadline ``T0 + 60 s``."""
    started = status is not MemberStatus.WAITING
    return Member(**{"run_id": "r1", "node_id": "n1", "status": status, "wave": 1 if started else None,
                     "deadline": T0 + timedelta(seconds=60) if started else None, **overrides})


def result(status: CheckStatus | str = CheckStatus.PASSED, test: str = "matmul", **overrides: Any) -> Result:
    """A check run's result of ``test`` at its first attempt, with no reason."""
    return Result(**{"test": test, "status": CheckStatus(status), **overrides})


def executor_reading(*, now: datetime = T0, heard: float | None = 5.0, still: float | None = 5.0,
                     **overrides: Any) -> dict[str, Any]:
    """The health evaluator's stored row of executor ``ex-1`` (no signal yet), training at step 10: its last
    heartbeat ``heard`` seconds before ``now``, its step unchanged for ``still`` seconds (None: never)."""
    return {"executor_id": EX, "signal": None, "last_heartbeat": _ago(now, heard), "step": 10,
            "step_changed_at": _ago(now, still), "phase": "training", "progress_interval_seconds": None, **overrides}


def job_reading(*, now: datetime = T0, heard: float | None = 5.0, still: float | None = 5.0,
                **overrides: Any) -> dict[str, Any]:
    """The health evaluator's stored row of running job ``j1`` on ``ex-1`` (no signal yet), training at step 10:
    last heard of ``heard`` seconds before ``now``, its step unchanged for ``still`` seconds (None: never)."""
    return {"job_id": JOB, "executor_id": EX, "signal": None, "state": "running", "last_contact_at": _ago(now, heard),
            "step": 10, "step_changed_at": _ago(now, still), "phase": "training", "progress_interval_seconds": None,
            **overrides}


def _ago(now: datetime, seconds: float | None) -> datetime | None:
    return None if seconds is None else now - timedelta(seconds=seconds)


# -- the placement --------------------------------------------------------------------------------------------

def organisation(name: str = ORG, *, nominal: int | None = None, borrow: int | None = None, lend: int | None = None,
                 group: str = GROUP, **overrides: Any) -> Organisation:
    """Organisation ``name``: unmetered, or with a ``nominal`` share of ``group`` (borrowing and lending limits
    ``borrow`` and ``lend``; None: any). Any other field of ``Organisation`` is an override."""
    quotas = None if nominal is None else {group: GroupQuota(nominal, borrow, lend)}
    return Organisation(**{"name": name, "quotas": quotas, **overrides})


def pending(job_id: str = JOB, org: str = ORG, *, at: float = 0, since: datetime = T0, **overrides: Any) -> Pending:
    """Queued job ``job_id`` of ``org`` as the placement sees it, submitted ``at`` seconds after ``since``: one
    CPU-only worker, priority 0, no environment named. Any other field of ``Pending`` is an override."""
    return Pending(**{"job_id": job_id, "org": org, "created_at": since + timedelta(seconds=at), **overrides})


def executor_node(executor_id: str = EX, *offered: str, gpus: int = 0, group: str = GROUP,
                  free: bool = True) -> placement_types.Node:
    """The placement's view of a schedulable executor: free, ``gpus`` GPUs, offering the environments
    ``offered``."""
    return placement_types.Node(executor_id, group, gpus, free, frozenset(offered))


def running(job_id: str = JOB, org: str = ORG, *, executors: tuple[str, ...] = (EX,), group: str = GROUP,
            **overrides: Any) -> Running:
    """Job ``job_id`` of ``org`` running on ``executors`` of ``group``, one device each, preemptible, admitted
    at T0. Any other field of ``Running`` is an override."""
    return Running(**{"job_id": job_id, "org": org, "group": group, "devices": len(executors), "admitted_at": T0,
                      "executors": executors, **overrides})


def snapshot(*orgs: Organisation, nodes: Any = (), pending: Any = (), **overrides: Any) -> Snapshot:
    """A placement pass's snapshot of ``nodes`` and ``pending`` jobs for ``orgs`` (the unmetered organisation
    ``o`` when none is given); ``running``, ``cohorts``, ``budgets``, ``broken`` are overrides."""
    by_name = {o.name: o for o in orgs} if orgs else {ORG: organisation()}
    return Snapshot(**{"orgs": by_name, "nodes": list(nodes), "pending": list(pending), **overrides})


def candidate(job_id: str = JOB, org: str = ORG, *, at: float = 0, since: datetime = T0,
              **overrides: Any) -> Candidate:
    """Job ``job_id`` of ``org`` as candidate selection sees it: submitted ``at`` seconds after ``since``, one
    device, priority 0."""
    return Candidate(**{"job_id": job_id, "org": org, "created_at": since + timedelta(seconds=at), **overrides})


def queued_job(job_id: str = JOB, *, at: float = 0, since: datetime = T0, **overrides: Any) -> QueuedJob:
    """Job ``job_id`` as gang admission sees it: submitted ``at`` seconds after ``since``, one CPU-only worker."""
    return QueuedJob(**{"job_id": job_id, "created_at": since + timedelta(seconds=at), **overrides})
