"""Which queued jobs a placement pass considers when more are queued than it takes (``max_jobs_per_pass``).

Taking the oldest N would let an organisation with many old queued jobs fill every place, so a smaller one whose
jobs are beyond the first N would never be seen by fair share at all. Instead the N places go by **share
deficit**: each organisation's jobs in its own admission order (higher priority first, then older), each job
keyed by its organisation's weighted devices if it and the ones before it were admitted,
``(held + devices of its jobs up to this one) / weight``; the N lowest keys are taken (ties: older, then id).
So equal organisations holding nothing alternate, one holding more gets fewer places, one of weight 2 gets
twice as many, and every organisation with queued jobs gets about ``N / organisations`` places at least. Fair
share then orders the chosen ones (``fairshare``, ``placement``); this only decides who is seen.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Candidate:
    job_id: str
    org: str
    created_at: datetime
    priority: int = 0
    devices: int = 1  # what it would hold (model.devices: a CPU-only worker counts as one)


def within_org(job: Candidate) -> tuple:
    """An organisation's own order, as admission takes its jobs: higher priority first, then older."""
    return (-job.priority, job.created_at, job.job_id)


def choose(queued: Iterable[Candidate], limit: int, held: Mapping[str, int] | None = None,
           weights: Mapping[str, float] | None = None) -> list[str]:
    """The ids of at most ``limit`` jobs to consider, by share deficit (module docstring), in that order.
    ``held``: devices each organisation holds now; ``weights``: fair-share weights (missing: 1)."""
    held, weights = held or {}, weights or {}
    per_org: dict[str, list[Candidate]] = {}
    for job in queued:
        per_org.setdefault(job.org, []).append(job)
    keyed: list[tuple[float, datetime, str]] = []
    for org, jobs in per_org.items():
        weight = weights.get(org, 1.0) or 1.0
        total = held.get(org, 0)
        for job in sorted(jobs, key=within_org):
            total += max(1, job.devices)
            keyed.append((total / weight, job.created_at, job.job_id))
    return [job_id for _, _, job_id in heapq.nsmallest(max(0, limit), keyed)]
