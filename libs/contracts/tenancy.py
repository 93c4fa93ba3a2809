"""Organisations, projects and cohorts (issue 14): what admins set through ``set_org``, ``set_project`` and
``set_cohort``, owned by the queue (the single writer) and applied by its placement.

Quotas count *devices* per node group (a CPU-only worker counts as one, as the budget charges it). Every limit
is optional: ``quotas`` null is an unmetered organisation (bounded only by the fleet), a missing group is a
nominal of 0, a null borrowing limit borrows without limit and a null lending limit lends the whole nominal.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field

from .bounds import Id, Label
from .jobs import CHECKPOINT_QUOTA_MAX
from .envelope import Model
from .jobs import RunLimits

DEFAULT_ORG = "default"  # jobs and tokens from before tenancy belong here
DEFAULT_PROJECT = "default"
MAX_DEVICES = 1_000_000
# Placement divides devices held (at most MAX_DEVICES) by the weight: bounded both ways, every share is an ordinary
# float8. A weight of 5e-324 was once accepted and overflowed every placement pass (issue 26, item 4).
MIN_WEIGHT = 0.001
MAX_WEIGHT = 1000.0
MAX_BUDGET_GPU_SECONDS = 10.0**12


class Preemption(StrEnum):
    """What a cohort may do when a member wants back capacity another member borrowed."""

    NEVER = "never"  # the lender waits until borrowed work ends by itself
    RECLAIM_BORROWED = "reclaim_borrowed"  # jobs running on borrowed capacity are preempted, newest first
    BY_PRIORITY = "by_priority"  # as above, but only borrowed jobs of lower priority than the job reclaiming


class QuotaSpec(Model):
    nominal: int = Field(0, ge=0, le=MAX_DEVICES, description="Devices guaranteed in the group")
    borrowing_limit: int | None = Field(None, ge=0, le=MAX_DEVICES,
                                        description="Most devices above nominal borrowed from the cohort (null: any)")
    lending_limit: int | None = Field(None, ge=0, le=MAX_DEVICES,
                                      description="Most of the idle nominal others may borrow (null: all of it)")


class OrgSpec(Model):
    """An organisation (``PUT /v1/orgs/{name}``)."""

    cohort: Id | None = Field(None, description="Cohort it borrows from and lends to (null: none)")
    weight: float = Field(1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT, description="Fair-share weight")
    quotas: dict[Id, QuotaSpec] | None = Field(None, max_length=1000,
                                               description="Per node group (null: unmetered)")
    budget_gpu_seconds: float | None = Field(None, ge=0, le=MAX_BUDGET_GPU_SECONDS,
                                             description="GPU-seconds per period (null: none)")
    period: Literal["month", "day"] = Field("month", description="The budget's period (calendar, UTC)")
    checkpoint_quota_bytes: int | None = Field(
        None, ge=1, le=CHECKPOINT_QUOTA_MAX,
        description="Most bytes one checkpoint of any of its jobs may have: caps each job's own quota (null: none)")
    run_limits: RunLimits | None = Field(
        None, description="Memory, processes and disk each run of its jobs may use at most; a job that sets no "
        "limit of a kind gets this one, a job asking for more is refused (null: none)")
    description: Label = ""


class ProjectSpec(Model):
    description: Label = ""


class CohortSpec(Model):
    preemption: Preemption = Field(Preemption.RECLAIM_BORROWED, description="How borrowed capacity is reclaimed")
