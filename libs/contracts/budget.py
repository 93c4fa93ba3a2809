"""Budget events (``teto.budget.<job_id>.<event>``) published by the budget service, and its status RPC.

GPU-seconds are GPUs held x wall time while training, per worker; a CPU-only worker counts as one device.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from .bounds import Finite, Id, MetricName, Reason, Time
from .envelope import Envelope

GpuSeconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]  # sums of bounded samples: finite


class BudgetEventKind(StrEnum):
    WARNING = "warning"  # the first checkpoint is not expected to fit inside the ceiling
    EXHAUSTED = "exhausted"  # consumption reached the ceiling: the job must stop


class BudgetEvent(Envelope):
    SCHEMA = "teto.budget.event/1"

    job_id: Id
    event: BudgetEventKind
    ceiling_seconds: GpuSeconds
    consumed_seconds: GpuSeconds
    reason: Reason | None = None
    detail: dict[MetricName, Finite] = Field(default_factory=dict, max_length=100)


class BudgetStatusRequest(Envelope):
    SCHEMA = "teto.rpc.budget.status/1"

    job_id: Id


class BudgetStatusReply(Envelope):
    SCHEMA = "teto.rpc.budget.status.reply/1"

    job_id: Id | None = Field(None, description="The job asked about; none when the request could not be read")
    known: bool
    ceiling_seconds: GpuSeconds | None = None
    consumed_seconds: GpuSeconds = 0.0
    reason: Reason | None = Field(None, description="Why the request was refused (it could not be read)")


class OrgBudgetRequest(Envelope):
    """What placement needs to reserve against organisations' period budgets (tenancy): each organisation's
    GPU-seconds charged since its period began, and what each named job has consumed in all."""

    SCHEMA = "teto.rpc.budget.orgs/1"

    orgs: list[Id] = Field(max_length=10_000)
    since: Time
    jobs: list[Id] = Field(default_factory=list, max_length=100_000)


class OrgBudgetReply(Envelope):
    SCHEMA = "teto.rpc.budget.orgs.reply/1"

    org_consumed: dict[Id, GpuSeconds] = Field(default_factory=dict, max_length=10_000)
    job_consumed: dict[Id, GpuSeconds] = Field(default_factory=dict, max_length=100_000)
