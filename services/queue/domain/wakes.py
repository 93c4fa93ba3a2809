"""When placement should run at once rather than at its next tick (pure; services/queue/scheduler.py listens).

Placement has work only when a job becomes queued (a submit, a requeue, a lease lost, a gang's back-off over) or
an executor may have become free: its run's end is reported (``runs.py`` frees it then, ``executors.free_ended``)
or it reports accepting with no job (a node back, a check over). Anything else (steps, renewals, busy heartbeats)
leaves placement with nothing new to do.
"""

from __future__ import annotations

from collections.abc import Iterable

from libs.contracts.jobs import JobEvent, JobState
from libs.contracts.telemetry import Heartbeat

PLACEMENT = "placement"  # the loop's wake channel name (libs/runtime/wake.py)


def queues_a_job(events: Iterable[JobEvent]) -> bool:
    return any(e.state is JobState.QUEUED for e in events)


def offers_an_executor(beats: Iterable[Heartbeat]) -> bool:
    return any(hb.accepting and hb.job_id is None for hb in beats)


FEWEST = 16  # the fewest candidates a pass sized to the free executors considers
PER_FREE = 4  # candidates such a pass considers for each free executor


def pass_size(queued: bool, free: int, since_whole: float | None, interval: float, most: int) -> int:
    """How many candidates the next placement pass considers (0: none, the pass is skipped).

    A whole pass (``most``, ``max_jobs_per_pass``) plans every candidate and writes each one's waiting reason;
    it is made on the first pass and once ``interval`` (the placement tick) has passed since the last whole one
    (``since_whole`` seconds; None: none yet), free executors or not: reclaiming borrowed capacity and the
    waiting reasons can change even when no grant can follow. In between, a wake with nothing queued or no
    executor ``free`` (a burst of submits onto a busy fleet) costs one query; one with ``free`` executors gets a
    pass sized to them, ``PER_FREE`` candidates each and ``FEWEST`` at least: the jobs that would be granted
    first are the first by share deficit (``tenancy/candidates.py``), and every run's end wakes placement, so a
    whole pass's planning and waiting reasons for each freed executor would be repeated work (measured alone,
    the sizing did not move throughput: docs/performance.md, seventh round). A sized pass that leaves executors
    free is widened at once (``widen``)."""
    if not queued:
        return 0
    if since_whole is None or since_whole >= interval:
        return most
    if free <= 0:
        return 0
    return min(most, max(FEWEST, PER_FREE * free))


def widen(size: int, most: int, considered: int, placed_workers: int, free: int) -> bool:
    """Whether a pass of ``size`` candidates, ``considered`` of them found queued, that placed ``placed_workers``
    executors of the ``free`` ones must be followed at once by a whole one: it was sized below ``most``, more
    jobs may be queued beyond it (it found as many as it asked for) and executors are left free (its candidates
    did not fit them: gangs too wide, quotas, other node groups; a later job may)."""
    return size < most and considered >= size and placed_workers < free
