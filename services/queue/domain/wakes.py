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
