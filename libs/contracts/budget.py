"""Budget events (``teto.budget.<job_id>.<event>``) published by the budget service, and its status RPC.

GPU-seconds are GPUs held x wall time while training, per worker; a CPU-only worker counts as one device.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from .envelope import Envelope


class BudgetEventKind(StrEnum):
    WARNING = "warning"  # the first checkpoint is not expected to fit inside the ceiling
    EXHAUSTED = "exhausted"  # consumption reached the ceiling: the job must stop


class BudgetEvent(Envelope):
    SCHEMA = "teto.budget.event/1"

    job_id: str
    event: BudgetEventKind
    ceiling_seconds: float = Field(ge=0)
    consumed_seconds: float = Field(ge=0)
    reason: str | None = None
    detail: dict[str, float] = Field(default_factory=dict)


class BudgetStatusRequest(Envelope):
    SCHEMA = "teto.rpc.budget.status/1"

    job_id: str


class BudgetStatusReply(Envelope):
    SCHEMA = "teto.rpc.budget.status.reply/1"

    job_id: str
    known: bool
    ceiling_seconds: float | None = None
    consumed_seconds: float = 0.0
