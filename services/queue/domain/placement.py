"""Placement: which queued jobs go to which free executors, on a snapshot, as a pure function.

Jobs are considered first come, first served. An executor fits a worker when it has at least
``gpus_per_worker`` GPUs (0 asks for none, so any node fits, CPU-only included). Among fitting executors the
smallest is taken, so a CPU job does not occupy an eight-GPU node that a later GPU job needs. A job with
``workers > 1`` gets that many distinct executors at once or none (no half-held gangs); a job that does not
fit now is passed over, and later jobs may still use what is free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class QueuedJob:
    job_id: str
    created_at: datetime
    workers: int = 1
    gpus_per_worker: int = 0


@dataclass(frozen=True)
class FreeExecutor:
    executor_id: str
    gpus: int
    last_seen: datetime
    group: str = "default"


@dataclass(frozen=True)
class Assignment:
    job_id: str
    workers: tuple[str, ...]  # executor ids, rank order


def fits(executor: FreeExecutor, job: QueuedJob) -> bool:
    return executor.gpus >= job.gpus_per_worker


def place(queued_jobs: Sequence[QueuedJob], free_executors: Sequence[FreeExecutor], now: datetime, *,
          silent_after_seconds: float | None = None) -> list[Assignment]:
    """Assign free executors to queued jobs.

    ``silent_after_seconds``: executors not seen for longer than that before ``now`` are left out (a snapshot
    may hold an executor that has just gone quiet).
    """
    # 1. Usable executors, smallest first, then the most recently seen (more likely still alive), then by id.
    free = [e for e in free_executors
            if silent_after_seconds is None or (now - e.last_seen).total_seconds() <= silent_after_seconds]
    free.sort(key=lambda e: (e.gpus, -e.last_seen.timestamp(), e.executor_id))
    taken: set[str] = set()
    out: list[Assignment] = []
    # 2. Jobs in arrival order; the id breaks ties so the order is total.
    for job in sorted(queued_jobs, key=lambda j: (j.created_at, j.job_id)):
        chosen = [e.executor_id for e in free if e.executor_id not in taken and fits(e, job)][: job.workers]
        # 3. All or nothing: a gang that cannot have every worker takes none.
        if len(chosen) < job.workers:
            continue
        taken.update(chosen)
        out.append(Assignment(job.job_id, tuple(chosen)))
    return out
