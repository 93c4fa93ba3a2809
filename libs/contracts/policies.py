"""Scheduling policies set by admins: the gang policy (DESIGN.md section 8).

The queue owns the policy (it is the single writer, through the ``set_policy`` command) and applies it when it
admits gangs: how long a gang may take to form, how it backs off when it does not, whether gangs are admitted
one at a time, and what happens to a running gang when one of its nodes fails.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from pydantic import Field, model_validator

from .envelope import Model


class NodeFailureStrategy(StrEnum):
    REQUEUE_GANG = "requeue_gang"  # stop every worker, requeue, resume all ranks from the latest checkpoint
    FAIL_JOB = "fail_job"  # the job fails with reason node_failure


class GangPolicy(Model):
    """How gangs (jobs with ``workers > 1``) are admitted. Every field has a default."""

    ready_timeout_seconds: float = Field(
        120.0, gt=0, le=86_400, description="Time from reservation to every worker ready; a job may ask for less")
    backoff_base_seconds: float = Field(
        15.0, gt=0, le=86_400, description="Delay after the first timeout; doubles with each further one")
    backoff_max_seconds: float = Field(
        600.0, gt=0, le=7 * 86_400, description="Cap on the doubling delay (jitter adds at most 10% on top)")
    backoff_limit: int | None = Field(
        5, ge=0, le=10_000, description="Back-offs allowed; the next timeout fails the job (null: unlimited)")
    sequential_admission: bool = Field(
        True, description="At most one gang admitting at a time, so two gangs never hold half the nodes each")
    node_failure_strategy: NodeFailureStrategy = Field(
        NodeFailureStrategy.REQUEUE_GANG, description="What a node failure during a gang run does to the job")

    @model_validator(mode="after")
    def _max_not_below_base(self) -> Self:
        if self.backoff_max_seconds < self.backoff_base_seconds:
            raise ValueError(f"backoff_max_seconds {self.backoff_max_seconds:g} is below backoff_base_seconds "
                             f"{self.backoff_base_seconds:g}")
        return self
