"""The GPU-seconds a grant carries (``RunJob.remaining_gpu_seconds``): the job's ceiling less what the budget
service, the single writer of consumption, says it consumed. A job never granted before has consumed nothing
(usage is only charged while a granted process runs), so only a job placed again is asked about, over
``teto.rpc.budget.status`` (``budget_client``: a job the budget never saw consumed 0), all at once, with a short
timeout: no answer gives None (unknown, the executor then waits for the budget's stop as before). The placement
pass asks about the candidates it has just chosen under its placement lock, before it locks any row (``ask``), so
no row lock is held while the budget answers, and reads the answers once it has (``remaining_of``); a job placed
again that was not asked carries None."""

from __future__ import annotations

import asyncio

from libs.runtime.service import Runtime

from .budget_client import consumed
from .domain.facts import Job

MAX_WAIT_SECONDS = 0.5  # placement waits at most this long for the budget's answers


def remaining_seconds(ceiling: float, consumed: float | None) -> float | None:
    """What is left of ``ceiling`` after ``consumed`` GPU-seconds; None when consumption is unknown."""
    if consumed is None:
        return None
    return max(0.0, ceiling - consumed)


def needs_asking(job: Job) -> bool:
    """Only a job granted before can have consumed anything."""
    return job.lease_epoch > 0


async def ask(runtime: Runtime, jobs: list[Job], timeout: float) -> dict[str, float | None]:
    """What each job placed before has consumed, by id (None: no answer), asked all at once, bounded."""
    asked = [j for j in jobs if needs_asking(j)]
    wait = min(timeout, MAX_WAIT_SECONDS)
    answers = await asyncio.gather(*(consumed(runtime, j.id, wait) for j in asked)) if asked else []
    return {j.id: c for j, c in zip(asked, answers, strict=True)}


def remaining_of(jobs: list[Job], used: dict[str, float | None]) -> dict[str, float | None]:
    """The GPU-seconds left of each job, by id: a job never granted has its whole ceiling; one placed again what
    the budget said (None when it did not answer or was not asked)."""
    return {j.id: remaining_seconds(j.spec.gpu_ceiling_seconds, used.get(j.id) if needs_asking(j) else 0.0)
            for j in jobs}


async def remaining_for(runtime: Runtime, jobs: list[Job], timeout: float) -> dict[str, float | None]:
    """The GPU-seconds left of each job, by id (None: unknown): ``ask`` then ``remaining_of``."""
    return remaining_of(jobs, await ask(runtime, jobs, timeout))
