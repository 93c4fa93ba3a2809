"""The signal evaluator: the app's singleton that re-derives the signals of the executors and jobs that can have
changed (no_signal, stuck, ok: domain/signals.py decides every one) and writes the changed ones, with a
SignalChanged event per job, in one transaction (store/signals.py reads and writes).

Each write is conditional on the inputs read (contact time, step time, state) being unchanged, so a heartbeat
that lands between the read and the write is never overwritten with a verdict made without it; the next pass
judges it. The functions above ``Evaluator`` are pure: rows in (any mapping of the table's columns), what to
write out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from libs.contracts.jobs import JobState
from libs.contracts.nodes import Signal, SignalChanged
from libs.contracts.subjects import Subjects
from libs.contracts.telemetry import Phase
from libs.runtime import metrics
from libs.runtime.clock import Clock

from .domain.signals import SignalReading, Thresholds, due_bounds, executor_signal, job_signal
from .store import signals

Row = Mapping[str, Any]


@dataclass
class Evaluation:
    executors_changed: int = 0
    jobs_changed: int = 0
    changes: list[tuple[str, str]] = field(default_factory=list)  # (job | executor, new signal or "none")


def phase_of(value: str | None) -> Phase | None:
    """A stored phase; None for none or one this version does not know."""
    return Phase(value) if value in Phase.__members__.values() else None


def state_of(value: str | None) -> JobState | None:
    """A stored job state; None for none (no event yet) or one this version does not know."""
    return JobState(value) if value in JobState.__members__.values() else None


def signal_of(value: str | None) -> Signal | None:
    return Signal(value) if value else None


def thresholds_of(reading: SignalReading) -> str:
    """The thresholds a reading was judged with, as the row keeps them (JSON)."""
    return json.dumps({"no_signal_after_seconds": reading.no_signal_after,
                       "stuck_after_seconds": reading.stuck_after})


def reading_of(row: Row, contact: str, state: JobState | None, now: datetime, th: Thresholds,
               judge: Callable[..., SignalReading] = job_signal) -> SignalReading:
    """The row's signal now; ``contact``: its last-heard column (``last_heartbeat``, ``last_contact_at``)."""
    # A step that was never reported has no "last change": such a workload has no progress signal.
    step_changed = row["step_changed_at"] if row["step"] is not None else None
    return judge(state, row[contact], step_changed, phase_of(row["phase"]), now, th,
                 progress_interval_seconds=row["progress_interval_seconds"])


def job_changes(rows: Iterable[Row], now: datetime, th: Thresholds) -> list[tuple[Row, SignalReading, datetime]]:
    """The jobs whose signal differs from the stored one: (row, reading, since), ``since`` now where the inputs
    do not say when the signal became true."""
    out = []
    for row in rows:
        reading = reading_of(row, "last_contact_at", state_of(row["state"]), now, th)
        if reading.signal != signal_of(row["signal"]):
            out.append((row, reading, reading.since or now))
    return out


def job_writes(changes: list[tuple[Row, SignalReading, datetime]]) -> list[tuple]:
    """store/signals.py ``set_job_signals``'s rows: each with the inputs it was judged on (written only if
    they are still those in the table)."""
    return [(row["job_id"], reading.signal and str(reading.signal), since, thresholds_of(reading),
             row["last_contact_at"], row["step_changed_at"], row["state"]) for row, reading, since in changes]


def signal_changed(row: Row, reading: SignalReading, since: datetime) -> SignalChanged:
    """A job's new signal as the event downstream consumers read."""
    return SignalChanged(job_id=row["job_id"], executor_id=row["executor_id"], signal=reading.signal,
                         previous=signal_of(row["signal"]), since=since,
                         seconds_since_heartbeat=reading.seconds_since_heartbeat,
                         seconds_since_step_change=reading.seconds_since_step_change,
                         no_signal_after_seconds=reading.no_signal_after, stuck_after_seconds=reading.stuck_after)


def executor_changes(rows: Iterable[Row], now: datetime, th: Thresholds) -> list[tuple]:
    """The executors whose signal differs from the stored one, as store/signals.py ``set_executor_signals``'s
    rows. An executor's verdict does not depend on its job's state (``executor_signal``): its job is not read."""
    out = []
    for row in rows:
        reading = reading_of(row, "last_heartbeat", None, now, th, judge=executor_signal)
        if reading.signal != signal_of(row["signal"]):
            out.append((row["executor_id"], reading.signal and str(reading.signal), reading.since or now,
                        thresholds_of(reading), row["last_heartbeat"], row["step_changed_at"]))
    return out


class Evaluator:
    """One pass at a time (the app runs it as a singleton, woken by stored heartbeats and on an interval)."""

    def __init__(self, pool: asyncpg.Pool, subjects: Subjects, thresholds: Thresholds,
                 clock: Clock | None = None) -> None:
        self.pool = pool
        self.subjects = subjects
        self.thresholds = thresholds
        self.clock = clock or Clock()

    async def evaluate(self, now: datetime) -> Evaluation:
        """Re-derive every signal that can have changed; write the changed ones, with their events, in one
        transaction (jobs first, then executors: the heartbeat writes' order, so the two never deadlock)."""
        th, result = self.thresholds, Evaluation()
        async with self.pool.acquire() as conn, conn.transaction():
            bounds = due_bounds(now, th)
            changed_jobs = job_changes(await signals.due_jobs(conn, bounds), now, th)
            written = await signals.set_job_signals(conn, job_writes(changed_jobs))
            events = []
            for row, reading, since in changed_jobs:
                if row["job_id"] in written:
                    result.jobs_changed += 1
                    result.changes.append(("job", str(reading.signal or "none")))
                    events.append((self.subjects.job_event(row["job_id"], "signal"),
                                   signal_changed(row, reading, since)))
            await signals.add_events(conn, events)

            changed_executors = executor_changes(await signals.due_executors(conn, bounds), now, th)
            written = await signals.set_executor_signals(conn, changed_executors)
            result.executors_changed = len(written)
            result.changes += [("executor", str(signal or "none")) for key, signal, *_ in changed_executors
                               if key in written]
        return result

    async def run_pass(self) -> Evaluation:
        """One pass at the clock's now, its committed changes counted in the metrics."""
        result = await self.evaluate(self.clock.now())
        for kind, signal in result.changes:  # committed
            metrics.SIGNAL_CHANGES.labels(kind, signal).inc()
        return result
