"""What executors report: heartbeats (``teto.hb.<executor_id>``) and job progress (``teto.progress.<job_id>.<executor_id>``).

Heartbeats carry usage samples (device-seconds while training, numbered so a redelivered sample is counted
once) for the budget service and phase/step for the health service. Progress carries steps, checkpoints and
the run's outcome; each progress message names the lease epoch it was produced under.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field

from .bounds import (INT32_MAX, Address, Big, Count, Digest, Epoch, Id, Int32, JsonObject, Label, Observed,
                     ObservedFigures, Path, PositiveSeconds, QuotedOutput, Reason, Seconds, Seq, Time)
from .envelope import Envelope, Model


class Phase(StrEnum):
    IDLE = "idle"  # no job
    STARTING = "starting"  # process launched, no step yet
    TRAINING = "training"  # steps are expected
    CHECKPOINTING = "checkpointing"  # writing a checkpoint (a pause that is not stuck)
    STOPPING = "stopping"  # asked to stop, finishing
    ABANDONED = "abandoned"  # lost contact; took no new work until back in contact


class GpuInfo(Model):
    index: Count
    name: Label
    uuid: Label | None = None
    memory_total_mb: Big | None = None


class UsageSample(Model):
    job_id: Id
    epoch: Epoch
    seq: Seq = Field(description="Per (job, epoch) counter; redelivery of a seq is counted once")
    devices: int = Field(ge=1, le=INT32_MAX, description="GPUs held, or 1 for a CPU-only worker")
    wall_seconds: Seconds = Field(description="Wall time training since the previous sample")


class Heartbeat(Envelope):
    SCHEMA = "teto.hb/1"

    executor_id: Id
    node_id: Id
    group: Id
    gpus: list[GpuInfo] = Field(default_factory=list, max_length=1024)
    accepting: bool = Field(True, description="False while busy, abandoned or draining")
    job_id: Id | None = None
    epoch: Epoch | None = None
    phase: Phase = Phase.IDLE
    step: Big | None = None
    usage: UsageSample | None = None
    sent_at: Time
    interval_seconds: PositiveSeconds = Field(description="The executor's heartbeat interval")
    progress_interval_seconds: PositiveSeconds = Field(description="How often the step counter is measured")
    address: Address | None = Field(
        None, description="Host other nodes reach this node's workers at (gang rendezvous)")
    environments: list[Path] = Field(
        default_factory=list, max_length=64,
        description="Python environments prepared on this node that a job may name (TETO_ENVIRONMENTS)")
    boot_id: Id | None = Field(
        None, description="This agent start (NodeRegistered.boot_id): a node judged ready for an earlier start "
                          "takes no work until it has passed its checks again")


class ProgressBase(Envelope):
    job_id: Id
    epoch: Epoch
    executor_id: Id


class StepReport(ProgressBase):
    SCHEMA = "teto.progress.step/1"
    kind: Literal["step"] = "step"
    step: Big
    total_steps: Big | None = None
    loss: Observed = Field(None, description="Absent when not a finite number (a diverged run)")
    step_seconds: Seconds | None = Field(None, description="Mean wall time per step since the last report")
    metrics: ObservedFigures = Field(default_factory=dict, description="Metrics that are not finite are left out")


class CheckpointKind(StrEnum):
    FILE = "file"  # one file with its sidecar (sha256: the file's)
    DIRECTORY = "directory"  # a directory with its manifest (sha256: the manifest's; bytes: all its files)


class CheckpointReport(ProgressBase):
    SCHEMA = "teto.progress.checkpoint/1"
    kind: Literal["checkpoint"] = "checkpoint"
    step: Big
    path: Path
    upload_seconds: Seconds | None = Field(
        None, description="With a checkpoint store: from the run's report to its manifest stored (``path`` is then "
        "the manifest's address); absent when the checkpoint stays in the checkpoint directory")
    stored_bytes: Big | None = Field(
        None, description="With a checkpoint store: bytes the job's stored checkpoints hold once this one's "
        "retention is done (the usage report's checkpoint_bytes)")
    sha256: Digest | None = None
    bytes: Big | None = None
    checkpoint_kind: CheckpointKind = Field(CheckpointKind.FILE, description="A file or a directory checkpoint")
    files: Big | None = Field(None, description="Regular files in a directory checkpoint (its manifest lists them)")


class CheckpointSkipped(ProgressBase):
    SCHEMA = "teto.progress.checkpoint_skipped/1"
    kind: Literal["checkpoint_skipped"] = "checkpoint_skipped"
    path: Path
    reason: Reason


class StoreState(StrEnum):
    UPLOADING = "uploading"  # a reported checkpoint on its way to the store (not valid until stored)
    WAITING = "waiting"  # the store is unavailable: the run's resume (or an upload) is retried with back-off


class CheckpointStoreNote(ProgressBase):
    """The checkpoint store's side of a run (docs/checkpoint-store.md): a checkpoint queued for upload or retried
    while the store is down (``uploading``), or the run's resume waiting for the store (``waiting``)."""

    SCHEMA = "teto.progress.checkpoint_store/1"
    kind: Literal["checkpoint_store"] = "checkpoint_store"
    state: StoreState
    store: Path = Field(description="Where the store is (s3://bucket/prefix or file:///dir), never a credential")
    step: Big | None = None
    path: Path | None = Field(None, description="The checkpoint under the job's checkpoint directory")
    bytes: Big | None = None
    behind: Count = Field(0, description="Checkpoints reported by the run and not stored yet, this one included")
    reason: Reason | None = Field(None, description="Why the store is being retried (its last error)")


EXIT_PEER_LOST = 76  # a gang worker's exit status when its group could not form or lost a peer (teto.sdk)


class RunOutcome(StrEnum):
    SUCCEEDED = "succeeded"  # exit code 0
    FAILED = "failed"  # non-zero exit or crash: spends an attempt
    STOPPED = "stopped"  # stopped on request (cancel, ceiling)
    ABANDONED = "abandoned"  # the agent lost contact and stopped it: free
    HANDED_BACK = "handed_back"  # the agent could not take the grant (busy, checking) and never started it: free


# RunFinished.stop_reason of a run the agent stopped (checkpoint first) for an operator's forced health check: the
# queue requeues it under its own cause (AttemptCause.HEALTH_CHECK), not as a transport loss.
HEALTH_CHECK_STOP = "health_check"


# RunFinished.stop_reason of a run stopped because its executor leaves (a Slurm pilot's allocation ends): the job
# is requeued free, like a transport loss, and the queue gives that executor no more work.
LEAVING_STOP = "slurm_allocation_ending"
# RunFinished.stop_reason of a run abandoned because its agent is shutting down (SIGTERM, Ctrl-C on `teto up`): the
# same, so its job is not granted straight back to an agent on its way out (to wait there for a whole lease).
SHUTDOWN_STOP = "executor_shutdown"
LEAVING_REASONS = frozenset({LEAVING_STOP, SHUTDOWN_STOP})


class RunFinished(ProgressBase):
    SCHEMA = "teto.progress.finished/1"
    kind: Literal["finished"] = "finished"
    outcome: RunOutcome
    exit_code: Int32 | None = None
    error: QuotedOutput | None = Field(None, description="Tail of the error output (NULs shown as U+FFFD)")
    last_step: Big | None = None
    resumed_from_step: Big | None = None
    stop_reason: Reason | None = Field(None, description="stopped: the reason of the stop (gpu_ceiling: the "
                                                          "executor's own clock or the queue's directive); "
                                                          "slurm_allocation_ending or executor_shutdown: the "
                                                          "executor leaves and takes no more work")


class RunStarted(ProgressBase):
    SCHEMA = "teto.progress.started/1"
    kind: Literal["started"] = "started"
    resumed_from_step: Big | None = None
    resumed_from: Path | None = None
    device: Label = "cpu"
    detail: JsonObject = Field(default_factory=dict)


class WorkerReady(ProgressBase):
    """A gang worker's process group has formed (``init_process_group`` returned and a barrier passed)."""

    SCHEMA = "teto.progress.ready/1"
    kind: Literal["ready"] = "ready"
    rank: Count
    world_size: int = Field(ge=1, le=INT32_MAX)
    seconds_since_launch: Seconds | None = Field(None, description="From process start to ready")


Progress = Annotated[
    StepReport | CheckpointReport | CheckpointSkipped | RunStarted | RunFinished | WorkerReady | CheckpointStoreNote,
    Field(discriminator="kind"),
]
PROGRESS_TYPES: dict[str, type[ProgressBase]] = {
    "step": StepReport,
    "checkpoint": CheckpointReport,
    "checkpoint_skipped": CheckpointSkipped,
    "started": RunStarted,
    "finished": RunFinished,
    "ready": WorkerReady,
    "checkpoint_store": CheckpointStoreNote,
}
