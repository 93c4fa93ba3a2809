"""When placement should run at once rather than at its next tick (pure; services/queue/scheduler.py listens).

Placement has work only when a job becomes queued (a submit, a requeue, a lease lost, a gang's back-off over) or
an executor may have become free (it reports accepting with no job: right after a run ends, the agent's immediate
heartbeat says so). Anything else (steps, renewals, busy heartbeats) leaves placement with nothing new to do.
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


def full_pass_due(queued: bool, free: bool, since_full: float | None, interval: float) -> bool:
    """Whether a placement pass is worth its whole work (the candidates planned, every waiting reason written).
    Nothing queued: no. An executor free: yes, at once (a grant may follow). None free: a grant cannot follow,
    but reclaiming borrowed capacity and the waiting reasons still can change, so yes once ``interval`` (the
    placement tick) has passed since the last whole pass (``since_full`` seconds; None: none yet), as when only
    the tick drove placement; the wakes in between (a burst of submits onto a busy fleet) cost one query each."""
    if not queued:
        return False
    return free or since_full is None or since_full >= interval
