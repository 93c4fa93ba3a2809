"""Signals: whether a job (and the executor running it) is heard from and making progress.

One function, ``job_signal``, judges both the job badge and the executor list, so the two always agree for
the executor running a job. The rules (DESIGN section 6):

- ``no_signal``: nothing heard for longer than ``signal_timeout``;
- ``stuck``: heard from, phase ``training``, and the step has not advanced for longer than
  ``max(stuck_after, 2 x progress_interval)`` (the executor measures steps every ``progress_interval``, so a
  shorter threshold would flag a healthy job between two measurements);
- otherwise ``ok``. A signal does not apply (``None``) to jobs that have no executor of their own: queued,
  admitting, backoff, interrupted, and terminal jobs, whatever their last heartbeat said.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from libs.contracts.jobs import JobState
from libs.contracts.nodes import Signal
from libs.contracts.telemetry import Phase

# A job's signal describes its executor, so it applies only while an executor runs it.
SIGNAL_APPLIES = frozenset({JobState.RUNNING})


@dataclass(frozen=True)
class Thresholds:
    """How long silence and a standing step may last before they become a signal (seconds)."""

    signal_timeout_seconds: float
    stuck_after_seconds: float

    def stuck_threshold(self, progress_interval_seconds: float | None) -> float:
        return max(self.stuck_after_seconds, 2.0 * (progress_interval_seconds or 0.0))


@dataclass(frozen=True)
class SignalReading:
    """A signal with the numbers behind it, as the API shows them."""

    signal: Signal | None
    since: datetime | None  # when the signal became true, where that follows from the inputs
    seconds_since_heartbeat: float | None
    seconds_since_step_change: float | None
    no_signal_after: float
    stuck_after: float

    def detail(self) -> dict[str, Any]:
        return {
            "seconds_since_heartbeat": self.seconds_since_heartbeat,
            "seconds_since_step_change": self.seconds_since_step_change,
            "no_signal_after_seconds": self.no_signal_after,
            "stuck_after_seconds": self.stuck_after,
        }


def _age(now: datetime, then: datetime | None) -> float | None:
    return None if then is None else max(0.0, (now - then).total_seconds())


def job_signal(
    state: JobState | None,
    last_heartbeat_at: datetime | None,
    last_step_change_at: datetime | None,
    phase: Phase | None,
    now: datetime,
    thresholds: Thresholds,
    *,
    progress_interval_seconds: float | None = None,
) -> SignalReading:
    """The signal of a job in ``state`` (``None``: no lifecycle known, judge the executor alone).

    ``last_step_change_at`` is the last time the step (or the phase) changed; ``None`` means no step was ever
    reported, and a workload that never reports steps has no progress signal, so it is never stuck.
    """
    hb_age = _age(now, last_heartbeat_at)
    step_age = _age(now, last_step_change_at)
    stuck_after = thresholds.stuck_threshold(progress_interval_seconds)
    timeout = thresholds.signal_timeout_seconds

    def reading(signal: Signal | None, since: datetime | None) -> SignalReading:
        return SignalReading(signal, since, hb_age, step_age, timeout, stuck_after)

    if state is not None and state not in SIGNAL_APPLIES:
        return reading(None, None)
    if last_heartbeat_at is None or hb_age > timeout:
        return reading(Signal.NO_SIGNAL, last_heartbeat_at and last_heartbeat_at + timedelta(seconds=timeout))
    if phase == Phase.TRAINING and last_step_change_at is not None and step_age > stuck_after:
        return reading(Signal.STUCK, last_step_change_at + timedelta(seconds=stuck_after))
    return reading(Signal.OK, None)


def executor_signal(
    job_state: JobState | None,
    last_heartbeat_at: datetime | None,
    last_step_change_at: datetime | None,
    phase: Phase | None,
    now: datetime,
    thresholds: Thresholds,
    *,
    progress_interval_seconds: float | None = None,
) -> SignalReading:
    """The executor list's signal: its running job's reading, or its own liveness when it runs none.

    An executor always has a liveness signal, so a job state in which the job's signal does not apply
    (queued after a lease expiry, say, while a zombie still names it) judges the executor alone.
    """
    state = job_state if job_state in SIGNAL_APPLIES else None
    return job_signal(state, last_heartbeat_at, last_step_change_at, phase, now, thresholds,
                      progress_interval_seconds=progress_interval_seconds)


def due_bounds(now: datetime, th: Thresholds) -> tuple[datetime, ...]:
    """The instants the store's due queries (store/signals.py ``DUE_EXECUTORS``, ``DUE_JOBS``) compare with, each
    1 ms wide the lenient way, so the rows they return are a superset of those ``job_signal`` would change (the
    stuck threshold is the larger of ``stuck_after`` and two progress intervals: both must have passed)."""
    slack, timeout, still = timedelta(milliseconds=1), timedelta(seconds=th.signal_timeout_seconds), \
        timedelta(seconds=th.stuck_after_seconds)
    return (now - timeout - slack, now - timeout + slack, now - still + slack, now + slack, now - still - slack,
            now - slack)
