"""GPU usage reports (``teto.usage.<executor_id>``, stream USAGE kept 14 days): the only carrier of charged time.

An executor meters each training process from its start to its exit and cuts the time into numbered stretches
(``UsageRecord``); it sends them, oldest first, in ``UsageReport`` messages and keeps each one until JetStream
acknowledged it, so a partition or a budget-service outage delays usage but never loses it. The budget service
charges each record once by (job, executor, epoch, seq), whether or not the epoch is still the job's current
one: time used by a worker that lost its lease was really used.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import ConfigDict, Field

from .envelope import Envelope, Model

INT32_MAX = 2**31 - 1  # epoch, seq and devices land in int4 columns of budget.ledger
MAX_RECORD_SECONDS = 30 * 86400.0  # one record may cover a whole outage (the meter accrues while it waits)
MAX_RECORDS_PER_REPORT = 200  # a report stays a few tens of KiB, far under the server's max payload


class UsageRecord(Model):
    """One stretch of one worker's running time on one (job, lease epoch)."""

    model_config = ConfigDict(allow_inf_nan=False)

    job_id: str = Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x20.*>]+$")
    epoch: int = Field(ge=1, le=INT32_MAX, description="The lease epoch the worker ran under")
    seq: int = Field(ge=1, le=INT32_MAX, description="Per (job, epoch, executor) counter from 1; charged once")
    devices: int = Field(ge=1, le=4096, description="GPUs held, or 1 for a CPU-only worker")
    wall_seconds: float = Field(ge=0, le=MAX_RECORD_SECONDS, description="Wall time the process ran in the stretch")
    started_at: datetime | None = Field(None, description="Start of the stretch (the executor's clock)")
    ended_at: datetime | None = Field(None, description="End of the stretch (the executor's clock)")
    last: bool = Field(False, description="Cut at the process's exit: the run's usage is complete with it")


class UsageReport(Envelope):
    SCHEMA = "teto.usage/1"

    executor_id: str = Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x20.*>]+$")
    node_id: str = Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x20.*>]+$")
    records: list[UsageRecord] = Field(min_length=1, max_length=MAX_RECORDS_PER_REPORT,
                                       description="Oldest first; a retried report carries the same records")
