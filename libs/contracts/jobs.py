"""Jobs on the wire: the job spec a user submits, the lifecycle states, and the job-state events.

Events go to ``teto.job.<job_id>.<event>``, ordered per job by ``seq``; they are what downstream consumers
subscribe to. The queue service is their single writer (the health service adds ``signal`` events).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator

from .bounds import (SEED_MAX, Actor, ArgvItem, Big, Count, EnvName, Epoch, Id, JsonObject, Label, Path,
                     Reason, Seq, Time)
from .envelope import Envelope, Model
from .secrets import EnvEntry


class JobState(StrEnum):
    QUEUED = "queued"  # waiting for placement
    ADMITTING = "admitting"  # gang forming: nodes reserved, waiting for every worker to be ready
    RUNNING = "running"  # a lease is held and the workload runs
    INTERRUPTED = "interrupted"  # GPU ceiling reached; checkpoint preserved, resumable by requeue
    BACKOFF = "backoff"  # gang timed out; requeues by itself later
    SUCCEEDED = "succeeded"  # the workload exited 0
    FAILED = "failed"  # attempts spent or a permanent error
    CANCELLED = "cancelled"  # an operator cancelled it


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

# The most bytes one checkpoint of a job may have (issue 26): a larger one is refused when written, and never
# hashed when read. 64 GiB by default (a full fine-tune's state of a few billion parameters); an organisation's
# ``checkpoint_quota_bytes`` caps every job of it (the grant carries the smaller of the two).
CHECKPOINT_QUOTA_DEFAULT = 64 * 2**30
CHECKPOINT_QUOTA_MAX = 2**50  # 1 PiB: a bound, not a promise of room


class AttemptCause(StrEnum):
    TRAINING_ERROR = "training_error"  # the training process exited with failure: spends an attempt
    TRANSPORT_LOST = "transport_lost"  # lease expired or executor abandoned: free
    NODE_FAILURE = "node_failure"  # node failed its health check: free
    GANG_TIMEOUT = "gang_timeout"  # gang not ready in time: free
    HANDED_BACK = "handed_back"  # the executor gave the grant back unstarted (busy, checking its node): free
    PREEMPTED = "preempted"  # checkpointed and stopped to give borrowed capacity back (tenancy): free
    HEALTH_CHECK = "health_check"  # checkpointed and stopped for an operator's forced health check: free


# The causes that spend one of the spec's max_attempts; every other cause is an interruption, counted apart.
SPENDS_ATTEMPT = frozenset({AttemptCause.TRAINING_ERROR})


class FinetuneParams(Model):
    steps: int = Field(300, ge=1, le=10_000_000, description="Optimizer steps in total")
    batch_size: int = Field(16, ge=1, le=4096)
    seq_len: int = Field(64, ge=8, le=4096, description="Tokens per training sequence")
    learning_rate: float = Field(3e-3, gt=0, le=1.0)
    seed: int = Field(0, ge=0, le=SEED_MAX, description="0 to 2**32 - 1 (what the fine-tune can seed torch with)")
    step_delay_seconds: float = Field(0.0, ge=0, le=60, description="Extra sleep per step (tests, demos)")


class FinetuneWorkload(Model):
    kind: Literal["finetune"] = "finetune"
    params: FinetuneParams = Field(default_factory=FinetuneParams)


class CommandWorkload(Model):
    kind: Literal["command"] = "command"
    command: list[ArgvItem] = Field(min_length=1, max_length=100_000, description="argv of the user's training script")
    env: dict[EnvName, EnvEntry] = Field(
        default_factory=dict, max_length=10_000,
        description='Extra environment variables (names [A-Za-z_][A-Za-z0-9_]*); a value {"secret": "..."} is '
        'encrypted by the gateway and shown to no reader (docs/security/access.md)')

    @field_validator("command")
    @classmethod
    def _no_empty_program(cls, v: list[str]) -> list[str]:
        if not v[0].strip():
            raise ValueError("the program (first element) must not be empty")
        return v


Workload = Annotated[FinetuneWorkload | CommandWorkload, Field(discriminator="kind")]


def _environment(value: str) -> str:
    if not value.startswith("/") or any(ord(c) < 32 or c == "," for c in value):
        raise ValueError("an environment is an absolute path (an interpreter or a venv/conda directory), without "
                         "commas or control characters")
    return value.rstrip("/") or "/"


EnvironmentPath = Annotated[Path, AfterValidator(_environment)]


class RunLimits(Model):
    """What each of a job's runs may use on its node (unset: no limit of that kind). The executor enforces each
    where the host allows it (a cgroup v2 controller, else a per-process rlimit) and says plainly, in the run's
    ``started`` event and its log, which it could not (docs/security/jobs.md)."""

    memory_mb: int | None = Field(None, ge=16, le=64 << 20, description="Memory of the run, MiB (RAM; no swap)")
    pids: int | None = Field(None, ge=8, le=4_194_304, description="Processes and threads of the run at once")
    disk_mb: int | None = Field(None, ge=1, le=1 << 30,
                                description="Bytes the run may write, MiB: the largest file it may make")


class JobSpec(Model):
    """What a user submits (``POST /v1/jobs``). Every field but ``workload`` has a default."""

    name: Label = Field("", description="Shown in lists; no control characters")
    workload: Workload
    workers: int = Field(1, ge=1, le=256, description="Gang size; each worker runs on its own node")
    gpus_per_worker: int = Field(
        0, ge=0, le=64, description="GPUs each worker needs; 0 runs on any node (a CPU-only node counts as 1 device)"
    )
    gpu_ceiling_seconds: float = Field(3600.0, gt=0, le=10**9, description="Total GPU-second ceiling")
    checkpoint_every_steps: int = Field(50, ge=1, le=10_000_000)
    checkpoints_kept: int | None = Field(
        None, ge=0, le=100_000,
        description="Complete checkpoints kept in the job's checkpoint directory: once a newer one is complete, "
        "older ones beyond this many are deleted (the newest is never); 0 keeps every one; unset, the executor's "
        "default (TETO_CHECKPOINTS_KEPT, 3)")
    checkpoint_quota_bytes: int = Field(
        CHECKPOINT_QUOTA_DEFAULT, ge=1, le=CHECKPOINT_QUOTA_MAX,
        description="Most bytes one checkpoint may have (64 GiB by default); the organisation's quota caps it. A "
        "larger checkpoint is refused when written (a checkpoint_skipped event says why) and never verified on resume")
    max_attempts: int = Field(3, ge=1, le=100, description="Training failures allowed before the job fails")
    estimated_step_seconds: float | None = Field(
        None, gt=0, le=86_400, description="The user's estimate of one step's wall time, for an early ceiling warning"
    )
    ready_timeout_seconds: float | None = Field(
        None, gt=0, le=86_400,
        description="Gangs: time for every worker to be ready; shorter than the gang policy's, never longer"
    )
    project: Id = Field("default", description="Project of the submitter's organisation the job belongs to")
    priority: int = Field(0, ge=-1000, le=1000, description="Within its organisation: higher is admitted first")
    limits: RunLimits = Field(default_factory=RunLimits,
                              description="Memory, processes and disk each run may use (within the organisation's)")
    environment: EnvironmentPath | None = Field(
        None, description="The Python environment a command runs in: an interpreter or a venv/conda directory "
        "prepared on the nodes (teto env create), one of those a node offers (TETO_ENVIRONMENTS); refused at submit "
        "when no node offers it; unset: the executor's own interpreter")


class JobEventKind(StrEnum):
    SUBMITTED = "submitted"
    LEASED = "leased"
    STARTED = "started"
    CHECKPOINTED = "checkpointed"
    CHECKPOINT_SKIPPED = "checkpoint_skipped"
    LEASE_EXPIRED = "lease_expired"
    ABANDONED = "abandoned"
    ATTEMPT_FAILED = "attempt_failed"
    REQUEUED = "requeued"
    INTERRUPTED = "interrupted"
    BACKOFF = "backoff"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STOP_REQUESTED = "stop_requested"
    SIGNAL = "signal"
    WORKER_READY = "worker_ready"  # a gang worker's process group formed (admitting)
    ADMITTED = "admitted"  # every gang worker ready: admitting -> running
    WORKER_LOST = "worker_lost"  # a running gang lost a worker (node failure); the policy's strategy follows


class JobEvent(Envelope):
    SCHEMA = "teto.job.event/1"

    job_id: Id
    seq: Seq = Field(description="Position in this job's event sequence")
    event: JobEventKind
    state: JobState
    previous_state: JobState | None = None
    reason: Reason | None = None
    epoch: Epoch | None = None
    executor_id: Id | None = None
    detail: JsonObject = Field(default_factory=dict)


class JobView(Model):
    """The job as the gateway shows it (read model owned by the queue)."""

    id: Id
    name: Label
    owner: Actor
    state: JobState
    spec: JobSpec
    attempts: dict[Label, Count]
    executor_id: Id | None = None
    lease_epoch: Count = 0
    lease_expires_at: Time | None = None
    last_step: Big | None = None
    last_checkpoint: JsonObject | None = None
    reason: Reason | None = None
    created_at: Time
    updated_at: Time
