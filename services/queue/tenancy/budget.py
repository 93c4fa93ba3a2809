"""An organisation's GPU-second budget for a period: admission reserves a job's remaining ceiling, the job's
end releases what it did not use.

``available = budget - consumed - reserved``. A job is admitted only when its remaining ceiling fits in what is
available, so however the running jobs end, consumption stays within the budget (a job is stopped at its
ceiling). When a run ends, its reservation is replaced by what it really used (the ledger's figure). A requeue
asks for a new ceiling: one that does not fit what the organisation has left is refused at once with the numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

HOUR = 3600.0


def gpu_hours(seconds: float) -> str:
    """GPU-hours to a tenth; under six minutes, GPU-seconds (a tenth of an hour would read as nothing)."""
    return f"{seconds / HOUR:.1f} GPU-h" if seconds >= HOUR / 10 else f"{seconds:.0f} GPU-s"


@dataclass(frozen=True)
class BudgetAccount:
    org: str
    budget: float | None  # GPU-seconds this period; None: no budget
    consumed: float = 0.0  # charged this period (the ledger's sum)
    reservations: Mapping[str, float] = field(default_factory=dict)  # job id -> GPU-seconds held back

    @property
    def reserved(self) -> float:
        return sum(self.reservations.values())

    @property
    def available(self) -> float | None:
        if self.budget is None:
            return None
        return max(0.0, self.budget - self.consumed - self.reserved)


@dataclass(frozen=True)
class BudgetRefusal:
    reason: str
    numbers: dict[str, float]


def refusal(account: BudgetAccount, needs: float) -> BudgetRefusal | None:
    """Why a job needing ``needs`` GPU-seconds cannot be admitted now (None: it can)."""
    left = account.available
    if left is None or needs <= left:
        return None
    return BudgetRefusal(f"organisation budget: {gpu_hours(left)} left, job needs {gpu_hours(needs)}",
                         {"budget_gpu_seconds": account.budget or 0.0, "consumed_gpu_seconds": account.consumed,
                          "reserved_gpu_seconds": account.reserved, "available_gpu_seconds": left,
                          "job_needs_gpu_seconds": needs})


def reserve(account: BudgetAccount, job_id: str, needs: float) -> BudgetAccount | BudgetRefusal:
    """Hold back ``needs`` for a job being admitted (a job holding one already keeps the larger figure)."""
    if needs < 0:
        raise ValueError(f"a reservation is >= 0, not {needs}")
    if job_id in account.reservations:
        return account
    refused = refusal(account, needs)
    if refused is not None:
        return refused
    return replace(account, reservations={**account.reservations, job_id: needs})


def settle(account: BudgetAccount, job_id: str, used: float) -> BudgetAccount:
    """The run ended having used ``used``: its reservation goes, its use is consumed (the unused part is free)."""
    if used < 0:
        raise ValueError(f"use is >= 0, not {used}")
    rest = {k: v for k, v in account.reservations.items() if k != job_id}
    return replace(account, consumed=account.consumed + used, reservations=rest)


def requeue_refusal(account: BudgetAccount, job_id: str, new_remaining: float) -> BudgetRefusal | None:
    """A requeue's new remaining ceiling (new ceiling - consumed) checked at the command against what the
    organisation has left this period: its budget less what it consumed and what its other jobs hold reserved
    (the job's own reservation, if any, is its to replace). Over it, the requeue is refused with the numbers
    (it could only wait); another try may fit once other runs end and release what they did not use."""
    if account.budget is None:
        return None
    others = account.reserved - account.reservations.get(job_id, 0.0)
    best = max(0.0, account.budget - account.consumed - others)
    if new_remaining <= best:
        return None
    return BudgetRefusal(f"organisation {account.org} budget: {gpu_hours(best)} left, the new ceiling needs "
                         f"{gpu_hours(new_remaining)}",
                         {"budget_gpu_seconds": account.budget, "consumed_gpu_seconds": account.consumed,
                          "reserved_gpu_seconds": others, "remaining_gpu_seconds": best,
                          "asked_gpu_seconds": new_remaining})


def period_start(period: str, now: datetime) -> datetime:
    """The start of the budget period holding ``now`` (calendar month or day, in ``now``'s time zone)."""
    if period == "month":
        return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    raise ValueError(f"a budget period is 'month' or 'day', not {period!r}")
