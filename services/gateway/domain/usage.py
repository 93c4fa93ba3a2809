"""The usage report: GPU time and jobs per organisation, project or user over a period, from the budget ledger's
charges and the jobs' outcomes.

Definitions (docs/tenancy.md):
- ``gpu_seconds``: the ledger's charges in the period (devices x wall time of each stretch a process ran),
  attributed to the job's organisation, project and owner. The report's total is the ledger's sum for the same
  charges; each row is the exact sum of its own charges (``math.fsum``), so rows add up to the total.
- ``jobs``: jobs by outcome (succeeded, failed, cancelled, interrupted, active) among the jobs charged or
  submitted in the period.
- ``interruptions`` and ``lost_gpu_seconds``: runs ended without the job's consent (preemption, lease loss,
  node failure, gang timeout) and the GPU-seconds each one's charges in the period hold after its last
  checkpoint, the work the next run must redo (``live.work_after_checkpoint``, the job view's computation).
- ``checkpoint_cadence_met``: checkpoints made over checkpoints due (steps run / checkpoint_every_steps).
- ``queue_wait_seconds``: time jobs spent queued before each admission, summed; the mean is per job.
- ``checkpoint_bytes``: bytes the jobs' checkpoints hold in the checkpoint store now (each job's latest stored
  checkpoint says it, after its retention; jobs without a store count 0; docs/checkpoint-store.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from .live import as_time, work_after_checkpoint


class GroupBy(StrEnum):
    ORG = "org"
    PROJECT = "project"
    USER = "user"


OUTCOMES = ("succeeded", "failed", "cancelled", "interrupted", "active")


@dataclass(frozen=True)
class Charge:
    """One ledger row, attributed."""

    job_id: str
    gpu_seconds: float
    at: datetime


@dataclass(frozen=True)
class JobFacts:
    job_id: str
    org: str
    project: str
    user: str
    outcome: str = "active"  # one of OUTCOMES
    interruptions: int = 0
    lost_gpu_seconds: float = 0.0
    queue_wait_seconds: float = 0.0
    checkpoints_due: int = 0
    checkpoints_made: int = 0
    checkpoint_bytes: int = 0


@dataclass
class UsageRow:
    key: str  # the org, "org/project" or the user
    gpu_seconds: float = 0.0
    jobs: dict[str, int] = field(default_factory=lambda: {o: 0 for o in OUTCOMES})
    interruptions: int = 0
    lost_gpu_seconds: float = 0.0
    queue_wait_seconds: float = 0.0
    checkpoints_due: int = 0
    checkpoints_made: int = 0
    checkpoint_bytes: int = 0

    @property
    def gpu_hours(self) -> float:
        return self.gpu_seconds / 3600.0

    @property
    def job_count(self) -> int:
        return sum(self.jobs.values())

    @property
    def mean_queue_wait_seconds(self) -> float | None:
        return self.queue_wait_seconds / self.job_count if self.job_count else None

    @property
    def checkpoint_cadence_met(self) -> float | None:
        return min(1.0, self.checkpoints_made / self.checkpoints_due) if self.checkpoints_due else None


@dataclass(frozen=True)
class UsageReport:
    group_by: GroupBy
    start: datetime
    end: datetime
    rows: list[UsageRow]
    total_gpu_seconds: float  # the ledger's sum of the period's charges
    unattributed_gpu_seconds: float  # charges of jobs the queue does not know (none in a healthy system)


def key_of(job: JobFacts, group_by: GroupBy) -> str:
    if group_by is GroupBy.ORG:
        return job.org
    if group_by is GroupBy.PROJECT:
        return f"{job.org}/{job.project}"
    return job.user


def report(charges: Iterable[Charge], jobs: Iterable[JobFacts], group_by: GroupBy, start: datetime,
           end: datetime, *, org: str | None = None, owner: str | None = None) -> UsageReport:
    """Rows sorted by GPU time, largest first (then key). ``org`` keeps only that organisation's jobs, ``owner``
    only that user's (a principal without ``read:all`` sees its own usage only, as it sees its own jobs).

    A scoped report's total is the sum of its own jobs' charges and it has no unattributed charges: the rest of
    the ledger is other tenants' usage, which a scoped reader must not learn, not even as one sum."""
    scoped = org is not None or owner is not None
    facts = {j.job_id: j for j in jobs if (org is None or j.org == org) and (owner is None or j.user == owner)}
    in_period = [c for c in charges if start <= c.at < end]
    per_key: dict[str, list[float]] = {}
    unattributed: list[float] = []
    for charge in in_period:
        job = facts.get(charge.job_id)
        if job is None:
            if not scoped:
                unattributed.append(charge.gpu_seconds)
            continue
        per_key.setdefault(key_of(job, group_by), []).append(charge.gpu_seconds)
    rows: dict[str, UsageRow] = {k: UsageRow(k, gpu_seconds=math.fsum(v)) for k, v in per_key.items()}
    for job in facts.values():
        row = rows.setdefault(key_of(job, group_by), UsageRow(key_of(job, group_by)))
        row.jobs[job.outcome if job.outcome in row.jobs else "active"] += 1
        row.interruptions += job.interruptions
        row.lost_gpu_seconds += job.lost_gpu_seconds
        row.queue_wait_seconds += job.queue_wait_seconds
        row.checkpoints_due += job.checkpoints_due
        row.checkpoints_made += job.checkpoints_made
        row.checkpoint_bytes += job.checkpoint_bytes
    total = math.fsum(c.gpu_seconds for c in in_period if not scoped or c.job_id in facts)
    return UsageReport(group_by, start, end, sorted(rows.values(), key=lambda r: (-r.gpu_seconds, r.key)),
                       total, math.fsum(unattributed))


def to_csv_rows(result: UsageReport) -> list[list[str]]:
    """The report as CSV rows, header first (``teto usage --csv``)."""
    header = [result.group_by.value, "gpu_seconds", "gpu_hours", *[f"jobs_{o}" for o in OUTCOMES], "interruptions",
              "lost_gpu_seconds", "queue_wait_seconds", "checkpoint_cadence_met", "checkpoint_bytes"]
    out = [header]
    for row in result.rows:
        cadence = row.checkpoint_cadence_met
        out.append([row.key, f"{row.gpu_seconds:.3f}", f"{row.gpu_hours:.4f}", *[str(row.jobs[o]) for o in OUTCOMES],
                    str(row.interruptions), f"{row.lost_gpu_seconds:.3f}", f"{row.queue_wait_seconds:.3f}",
                    "" if cadence is None else f"{cadence:.3f}", str(row.checkpoint_bytes)])
    return out


INTERRUPTION_CAUSES = ("transport_lost", "node_failure", "preempted", "gang_timeout")
ENDED = {"succeeded", "failed", "cancelled", "interrupted"}


def charged_at(sample: Mapping[str, Any]) -> datetime | None:
    """When a usage sample counts, as ``budget.ledger_public`` says: the end of its stretch (the executor's
    clock), or when it was recorded for an old sample without one."""
    return as_time(sample.get("ended_at")) or as_time(sample.get("recorded_at"))


def interrupted_runs(events: Iterable[Mapping[str, Any]]) -> dict[int, Mapping[str, Any] | None]:
    """The runs (lease epochs) that ended without the job's consent, each with the last checkpoint recorded
    before its end (from any run: a run that made none resumed from it, so all its work is lost; None when the
    job had none). A run ends with an event of its epoch whose reason is an interruption cause and that leaves
    the running states (requeued, backoff, failed); a gang's ``requeued`` after its back-off has no epoch."""
    out: dict[int, Mapping[str, Any] | None] = {}
    checkpoint: Mapping[str, Any] | None = None
    for event in events:
        if event.get("event") == "checkpointed":
            checkpoint = event.get("detail") if isinstance(event.get("detail"), Mapping) else None
            continue
        epoch = event.get("epoch")
        if (event.get("reason") in INTERRUPTION_CAUSES and epoch is not None
                and event.get("state") not in ("running", "admitting") and epoch not in out):
            out[int(epoch)] = checkpoint
    return out


def lost_gpu_seconds(events: Iterable[Mapping[str, Any]], samples: Iterable[Mapping[str, Any]],
                     start: datetime | None = None, end: datetime | None = None) -> float:
    """GPU-seconds lost to interruptions: for each interrupted run, its usage samples charged in
    ``[start, end)`` after its last checkpoint. Counting only the period's charges keeps every row's lost time
    within its ``gpu_seconds``. ``samples`` are the job's (``budget.usage_public``), of any run."""
    runs = interrupted_runs(events)
    per_run: dict[int, list[Mapping[str, Any]]] = {}
    for sample in samples:
        at = charged_at(sample)
        if sample.get("epoch") not in runs or at is None:
            continue
        if (start is None or at >= start) and (end is None or at < end):
            per_run.setdefault(int(sample["epoch"]), []).append(sample)
    return math.fsum(work_after_checkpoint(rows, runs[epoch]) for epoch, rows in per_run.items())


def job_facts(job: dict, events: list[dict], samples: Iterable[Mapping[str, Any]] = (),
              start: datetime | None = None, end: datetime | None = None) -> JobFacts:
    """A job's facts for the report from its public row, its events in order and its usage samples: queue wait
    is the time from each ``submitted``/``requeued`` (or back-off end) to the next ``leased``; checkpoints due
    are the steps run over ``checkpoint_every_steps``; lost GPU-seconds as ``lost_gpu_seconds``."""
    attempts = job.get("attempts") or {}
    waited, since = 0.0, None
    checkpoints, held = 0, 0
    for event in events:
        kind, at = event["event"], event["time"]
        if kind in ("submitted", "requeued"):
            since = at
        elif kind == "leased" and since is not None:
            waited += max(0.0, (at - since).total_seconds())
            since = None
        elif kind == "checkpointed":
            checkpoints += 1
            stored = (event.get("detail") or {}).get("stored_bytes")
            if isinstance(stored, int) and not isinstance(stored, bool):
                held = stored  # the latest stored checkpoint says what the job's checkpoints hold now
    every = (job.get("spec") or {}).get("checkpoint_every_steps") or 0
    due = (job.get("last_step") or 0) // every if every else 0
    state = job.get("state")
    return JobFacts(job["id"], job.get("org") or "default", job.get("project") or "default", job.get("owner") or "",
                    outcome=state if state in ENDED else "active",
                    interruptions=sum(int(attempts.get(c, 0)) for c in INTERRUPTION_CAUSES),
                    lost_gpu_seconds=lost_gpu_seconds(events, samples, start, end), queue_wait_seconds=waited, checkpoints_due=due, checkpoints_made=checkpoints,
                    checkpoint_bytes=held)


def period_window(period: str | None, now: datetime) -> tuple[datetime, datetime]:
    """``YYYY-MM`` (a calendar month), ``YYYY-MM-DD`` (a day), or None: the current month, all in UTC."""
    if period is None:
        start = now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    elif len(period) == 7:
        start = datetime.strptime(period, "%Y-%m").replace(tzinfo=UTC)
    elif len(period) == 10:
        day = datetime.strptime(period, "%Y-%m-%d").replace(tzinfo=UTC)
        return day, day + timedelta(days=1)
    else:
        raise ValueError(f"a period is YYYY-MM or YYYY-MM-DD, not {period!r}")
    end = (start.replace(day=28) + timedelta(days=4)).replace(day=1)
    return start, end


def as_json(result: UsageReport) -> dict:
    return {"group_by": result.group_by.value, "start": result.start.isoformat(), "end": result.end.isoformat(),
            "total_gpu_seconds": result.total_gpu_seconds, "total_gpu_hours": result.total_gpu_seconds / 3600.0,
            "unattributed_gpu_seconds": result.unattributed_gpu_seconds,
            "rows": [{"key": r.key, "gpu_seconds": r.gpu_seconds, "gpu_hours": r.gpu_hours, "jobs": r.jobs,
                      "interruptions": r.interruptions, "lost_gpu_seconds": r.lost_gpu_seconds,
                      "queue_wait_seconds": r.queue_wait_seconds, "mean_queue_wait_seconds": r.mean_queue_wait_seconds,
                      "checkpoint_cadence_met": r.checkpoint_cadence_met, "checkpoint_bytes": r.checkpoint_bytes}
                     for r in result.rows]}
