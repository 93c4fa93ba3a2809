"""What executors report: heartbeats (``teto.hb.<executor_id>``) and job progress (``teto.progress.<job_id>``).

Heartbeats carry usage samples (device-seconds while training, numbered so a redelivered sample is counted
once) for the budget service and phase/step for the health service. Progress carries steps, checkpoints and
the run's outcome; each progress message names the lease epoch it was produced under.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field

from .envelope import Envelope, Model


class Phase(StrEnum):
    IDLE = "idle"  # no job
    STARTING = "starting"  # process launched, no step yet
    TRAINING = "training"  # steps are expected
    CHECKPOINTING = "checkpointing"  # writing a checkpoint (a pause that is not stuck)
    STOPPING = "stopping"  # asked to stop, finishing
    ABANDONED = "abandoned"  # lost contact; took no new work until back in contact


class GpuInfo(Model):
    index: int
    name: str
    uuid: str | None = None
    memory_total_mb: int | None = None


class UsageSample(Model):
    job_id: str
    epoch: int = Field(ge=1)
    seq: int = Field(ge=1, description="Per (job, epoch) counter; redelivery of a seq is counted once")
    devices: int = Field(ge=1, description="GPUs held, or 1 for a CPU-only worker")
    wall_seconds: float = Field(ge=0, description="Wall time training since the previous sample")


class Heartbeat(Envelope):
    SCHEMA = "teto.hb/1"

    executor_id: str
    node_id: str
    group: str
    gpus: list[GpuInfo] = Field(default_factory=list)
    accepting: bool = Field(True, description="False while busy, abandoned or draining")
    job_id: str | None = None
    epoch: int | None = None
    phase: Phase = Phase.IDLE
    step: int | None = None
    usage: UsageSample | None = None
    sent_at: datetime
    interval_seconds: float = Field(gt=0, description="The executor's heartbeat interval")
    progress_interval_seconds: float = Field(gt=0, description="How often the step counter is measured")
    address: str | None = Field(
        None, max_length=255, description="Host other nodes reach this node's workers at (gang rendezvous)")


class ProgressBase(Envelope):
    job_id: str
    epoch: int = Field(ge=1)
    executor_id: str


class StepReport(ProgressBase):
    SCHEMA = "teto.progress.step/1"
    kind: Literal["step"] = "step"
    step: int = Field(ge=0)
    total_steps: int | None = None
    loss: float | None = None
    step_seconds: float | None = Field(None, ge=0, description="Mean wall time per step since the last report")
    metrics: dict[str, float] = Field(default_factory=dict)


class CheckpointReport(ProgressBase):
    SCHEMA = "teto.progress.checkpoint/1"
    kind: Literal["checkpoint"] = "checkpoint"
    step: int = Field(ge=0)
    path: str
    sha256: str | None = None
    bytes: int | None = None


class CheckpointSkipped(ProgressBase):
    SCHEMA = "teto.progress.checkpoint_skipped/1"
    kind: Literal["checkpoint_skipped"] = "checkpoint_skipped"
    path: str
    reason: str


EXIT_PEER_LOST = 76  # a gang worker's exit status when its group could not form or lost a peer (teto.sdk)


class RunOutcome(StrEnum):
    SUCCEEDED = "succeeded"  # exit code 0
    FAILED = "failed"  # non-zero exit or crash: spends an attempt
    STOPPED = "stopped"  # stopped on request (cancel, ceiling)
    ABANDONED = "abandoned"  # the agent lost contact and stopped it: free
    HANDED_BACK = "handed_back"  # the agent could not take the grant (busy, checking) and never started it: free


class RunFinished(ProgressBase):
    SCHEMA = "teto.progress.finished/1"
    kind: Literal["finished"] = "finished"
    outcome: RunOutcome
    exit_code: int | None = None
    error: str | None = Field(None, max_length=8000, description="Tail of the error output")
    last_step: int | None = None
    resumed_from_step: int | None = None


class RunStarted(ProgressBase):
    SCHEMA = "teto.progress.started/1"
    kind: Literal["started"] = "started"
    resumed_from_step: int | None = None
    resumed_from: str | None = None
    device: str = "cpu"
    detail: dict[str, Any] = Field(default_factory=dict)


class WorkerReady(ProgressBase):
    """A gang worker's process group has formed (``init_process_group`` returned and a barrier passed)."""

    SCHEMA = "teto.progress.ready/1"
    kind: Literal["ready"] = "ready"
    rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    seconds_since_launch: float | None = Field(None, ge=0, description="From process start to ready")


Progress = Annotated[
    StepReport | CheckpointReport | CheckpointSkipped | RunStarted | RunFinished | WorkerReady,
    Field(discriminator="kind"),
]
PROGRESS_TYPES: dict[str, type[ProgressBase]] = {
    "step": StepReport,
    "checkpoint": CheckpointReport,
    "checkpoint_skipped": CheckpointSkipped,
    "started": RunStarted,
    "finished": RunFinished,
    "ready": WorkerReady,
}
