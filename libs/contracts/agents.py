"""Directives from the control plane to one executor agent: ``teto.agent.<executor_id>.<kind>``.

``run`` is the lease grant with everything the agent needs to start the workload; ``stop`` asks it to stop
the training process of a job (cancel, GPU ceiling), optionally after a final checkpoint.
"""

from __future__ import annotations

from pydantic import Field

from .bounds import INT32_MAX, Big, Count, Digest, Epoch, Id, PositiveSeconds, Reason, Rendezvous, Seconds
from .envelope import Envelope, Model
from .jobs import CHECKPOINT_QUOTA_MAX, JobSpec


class AcceptedCheckpoint(Model):
    """The latest checkpoint the queue accepted for a job: reported by the lease holder of ``epoch`` while that
    lease was the job's current one. A run resumes from this one only (the file whose sidecar says this step,
    checksum and epoch), never from a file because it is newest (DESIGN.md section 12)."""

    step: Big
    sha256: Digest | None = Field(None, description="As the report said; None for a report without one")
    epoch: Epoch | None = Field(None, description="The lease epoch of the run that wrote it; None: recorded before "
                                                  "checkpoints carried their epoch")


class RunJob(Envelope):
    SCHEMA = "teto.agent.run/1"

    job_id: Id
    epoch: Epoch
    executor_id: Id
    spec: JobSpec
    attempt: int = Field(ge=1, le=INT32_MAX, description="1 for the first run, +1 for every grant after")
    lease_seconds: PositiveSeconds
    heartbeat_seconds: PositiveSeconds
    rank: Count = 0
    world_size: int = Field(1, ge=1, le=INT32_MAX)
    rendezvous: Rendezvous | None = Field(None, description="host:port of rank 0 for torch.distributed")
    ready_timeout_seconds: PositiveSeconds | None = Field(
        None, description="Gangs: how long the queue waits for every worker to be ready")
    resume_from: AcceptedCheckpoint | None = Field(
        None, description="The latest checkpoint the queue accepted for the job (None: none, start from scratch); "
                          "every other checkpoint file in the job's directory is a fenced-out run's, ignored")
    remaining_gpu_seconds: float | None = Field(
        None, ge=0, le=1e12, allow_inf_nan=False,
        description="The job's GPU-seconds left at grant time (ceiling - consumed, all workers together); the "
                    "executor starts the ceiling stop by its own clock when its share is spent. None: unknown")
    checkpoint_quota_bytes: int | None = Field(
        None, ge=1, le=CHECKPOINT_QUOTA_MAX,
        description="The job's checkpoint quota at grant time: the smaller of its own and its organisation's. "
                    "None: the spec's own")


class StopJob(Envelope):
    SCHEMA = "teto.agent.stop/1"

    job_id: Id
    epoch: Epoch
    reason: Reason
    checkpoint_first: bool = Field(False, description="Write a final checkpoint before stopping, if possible")
    grace_seconds: Seconds = 10.0
