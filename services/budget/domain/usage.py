"""Which usage records a ledger charges, and the reconciliation that proves a job's total is its ledger's sum.

A record's identity is (job, executor, epoch, seq): the ledger charges each identity once, whatever the order,
the number of deliveries, or whether its epoch is still the job's current one. A late record of an old epoch
(a worker that lost contact kept running until it noticed, then sent its time once the partition healed) is
charged and counted as late, not ignored: that time was really used. A second delivery of an identity with
different figures is a contract breach by the sender; the first one stays charged and the conflict is counted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from .ledger import gpu_seconds

# Totals are sums of floats added in different orders (per batch in the account, per row in SQL): they agree
# to far better than a microsecond of GPU time, never exactly.
RECONCILE_ABS_TOLERANCE = 1e-6
RECONCILE_REL_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Charge:
    """One usage record as the ledger stores it."""

    job_id: str
    executor_id: str
    epoch: int
    seq: int
    devices: int
    wall_seconds: float
    started_at: datetime | None = None
    ended_at: datetime | None = None
    last: bool = False  # cut at the process's exit: the run's records end here

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.job_id, self.executor_id, self.epoch, self.seq)

    @property
    def gpu_seconds(self) -> float:
        return gpu_seconds(self.devices, self.wall_seconds)

    def same_figures(self, other: Charge) -> bool:
        return (self.devices, self.wall_seconds) == (other.devices, other.wall_seconds)


@dataclass
class Plan:
    """What to do with a batch: the rows to append, and what the rest were."""

    fresh: list[Charge] = field(default_factory=list)  # new identities, first occurrence in the batch
    duplicates: int = 0  # already charged (in the ledger or earlier in the batch): nothing to do
    conflicts: list[Charge] = field(default_factory=list)  # a known identity with other figures: not charged
    late: int = 0  # fresh records of an epoch older than the job's current one: charged all the same

    def added_by_job(self) -> dict[str, float]:
        added: dict[str, float] = {}
        for c in self.fresh:
            added[c.job_id] = added.get(c.job_id, 0.0) + c.gpu_seconds
        return added


def plan_charges(batch: Iterable[Charge], charged: dict[tuple[str, str, int, int], Charge],
                 current_epoch: dict[str, int]) -> Plan:
    """Split a batch into records to append and records already charged.

    ``charged`` holds the ledger's rows for the batch's identities; ``current_epoch`` the job's latest known
    lease epoch (0 or absent when unknown). The epoch only classifies a record as late, it never refuses one.
    """
    plan = Plan()
    seen: dict[tuple[str, str, int, int], Charge] = dict(charged)
    for c in batch:
        known = seen.get(c.key)
        if known is not None:
            if known.same_figures(c):
                plan.duplicates += 1
            else:
                plan.conflicts.append(c)
            continue
        seen[c.key] = c
        plan.fresh.append(c)
        if c.epoch < current_epoch.get(c.job_id, 0):
            plan.late += 1
    return plan


@dataclass(frozen=True)
class Reconciliation:
    """One job's account checked against its ledger.

    ``missing`` counts records absent from the ledger although a later one of the same run (job, executor,
    epoch; numbered from 1) is there: in flight (a redelivered batch) or lost. It is reported apart from
    ``ok``, which is the totals' agreement alone.
    """

    job_id: str
    consumed_seconds: float  # the running total the account keeps (what the ceiling is judged on)
    ledger_seconds: float  # the sum of the job's ledger rows
    rows: int
    missing: int = 0
    open_runs: int = 0  # runs (executor, epoch) whose record cut at the process's exit has not arrived (yet)

    @property
    def difference(self) -> float:
        return self.consumed_seconds - self.ledger_seconds

    @property
    def ok(self) -> bool:
        return math.isclose(self.consumed_seconds, self.ledger_seconds, rel_tol=RECONCILE_REL_TOLERANCE,
                            abs_tol=RECONCILE_ABS_TOLERANCE)

    def as_dict(self) -> dict[str, object]:
        return {"job_id": self.job_id, "consumed_seconds": self.consumed_seconds,
                "ledger_seconds": self.ledger_seconds, "rows": self.rows, "difference": self.difference,
                "missing": self.missing, "open_runs": self.open_runs, "ok": self.ok}


def missing_in_run(highest_seq: int, present: int) -> int:
    """Records of one run (job, executor, epoch) absent below its highest seq: seqs are numbered from 1 and
    the ledger holds each at most once, so every number up to the highest should be there."""
    return max(0, highest_seq - present)
