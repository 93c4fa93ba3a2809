"""The words of tenancy: organisations (each with an optional cohort, a weight and a quota per node group),
projects, cohorts with their preemption policy, and the devices a job asks for.

Units: capacity is counted in *devices* per node group, the budget's unit: a worker holds ``gpus_per_worker``
GPUs, and a CPU-only worker (``gpus_per_worker = 0``) counts as one device, as the budget charges it. A limit of
``None`` is unlimited; a missing group quota is nominal 0 (the organisation may still borrow there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from libs.contracts.tenancy import DEFAULT_ORG, DEFAULT_PROJECT, Preemption  # noqa: F401 - the words, re-exported


@dataclass(frozen=True)
class GroupQuota:
    """An organisation's concurrent share of one node group, in devices."""

    nominal: int = 0  # guaranteed while the organisation asks for it
    borrowing_limit: int | None = None  # most devices above nominal it may borrow from its cohort; None: any
    lending_limit: int | None = None  # most of its idle nominal others may borrow; None: all of it

    def __post_init__(self) -> None:
        for name in ("nominal", "borrowing_limit", "lending_limit"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, not {value}")

    @property
    def lendable(self) -> int:
        """What this organisation puts in its cohort's pool of one group."""
        return self.nominal if self.lending_limit is None else min(self.lending_limit, self.nominal)

    @property
    def guaranteed(self) -> int:
        """The part of nominal never lent: usage up to it draws nothing from the pool."""
        return self.nominal - self.lendable


NO_QUOTA = GroupQuota()  # a group an organisation has no share of (one value: frozen, made once, not per call)


@dataclass(frozen=True)
class Organisation:
    name: str
    cohort: str | None = None  # None: borrows and lends nothing
    weight: float = 1.0  # fair share: an organisation of weight 2 is entitled to twice the share of weight 1
    quotas: Mapping[str, GroupQuota] | None = None  # by node group; None: unmetered (no quota at all)
    budget_gpu_seconds: float | None = None  # per period; None: no budget
    period: str = "month"  # the budget's period: "month" (calendar, UTC) or "day"
    checkpoint_quota_bytes: int | None = None  # most bytes of one checkpoint of any of its jobs; None: no cap

    def __post_init__(self) -> None:
        if not self.weight > 0:
            raise ValueError(f"weight must be > 0, not {self.weight}")
        if self.budget_gpu_seconds is not None and self.budget_gpu_seconds < 0:
            raise ValueError(f"budget_gpu_seconds must be >= 0, not {self.budget_gpu_seconds}")

    @property
    def metered(self) -> bool:
        return self.quotas is not None

    def quota(self, group: str) -> GroupQuota:
        return (self.quotas or {}).get(group, NO_QUOTA)

    def borrowing_limit(self, group: str) -> int | None:
        """Alone (no cohort) an organisation borrows nothing, whatever its quota says; unmetered, it is unbounded."""
        if not self.metered:
            return None
        return 0 if self.cohort is None else self.quota(group).borrowing_limit

    def ceiling(self, group: str) -> int | None:
        """The most devices it may hold in a group: nominal + borrowing limit (None: unbounded)."""
        limit = self.borrowing_limit(group)
        return None if limit is None else self.quota(group).nominal + limit


@dataclass(frozen=True)
class Project:
    org: str
    name: str


@dataclass(frozen=True)
class Cohort:
    name: str
    preemption: Preemption = Preemption.RECLAIM_BORROWED


def devices(workers: int, gpus_per_worker: int) -> int:
    """Devices a job holds: a CPU-only worker counts as one, as the budget charges it."""
    return workers * max(1, gpus_per_worker)


@dataclass(frozen=True)
class Pending:
    """A queued job as tenancy sees it."""

    job_id: str
    org: str
    created_at: datetime
    workers: int = 1
    gpus_per_worker: int = 0
    priority: int = 0
    project: str = DEFAULT_PROJECT
    needs_gpu_seconds: float = 0.0  # what admission reserves: the job's remaining ceiling
    environment: str | None = None  # the Python environment it names: only nodes offering it take it

    @property
    def devices(self) -> int:
        return devices(self.workers, self.gpus_per_worker)


@dataclass(frozen=True)
class Running:
    """A job holding devices now, for usage and preemption."""

    job_id: str
    org: str
    group: str
    devices: int  # its nodes' devices: a worker holds its whole node
    priority: int = 0
    admitted_at: datetime | None = None
    executors: tuple[str, ...] = ()  # where it runs: a preemption frees these
    preemptible: bool = True  # running (single workers and gangs); a gang still forming is not
    stopping: bool = False  # already preempted and stopping: its nodes are coming free for whoever reclaims


def checkpoint_quota(job_quota: int, org: Organisation | None) -> int:
    """The checkpoint quota a grant carries: the job's own, capped by its organisation's (issue 26). An
    organisation that is gone (or has no cap) leaves the job's own."""
    if org is None or org.checkpoint_quota_bytes is None:
        return job_quota
    return min(job_quota, org.checkpoint_quota_bytes)
