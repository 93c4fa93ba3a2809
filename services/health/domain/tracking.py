"""How a job event lands on health's row of its job (the state the signals are judged in, and the lease epoch
heartbeats are fenced by), one event at a time; the store folds a batch of events through it and writes each
job once.

- An event at or below the row's ``event_seq`` was applied already (a redelivery, or overtaken): ignored.
- Otherwise the row takes its state and sequence number, the higher of the two epochs, and its executor when it
  names one. A new lease epoch resets the job's contact to the event: the new executor has one signal timeout to
  send its first heartbeat, and the old executor's phase and step no longer describe the job.
- A job health has no row for yet starts from the event (contact at its time, whatever its epoch).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class JobRow:
    state: str | None
    event_seq: int
    epoch: int
    executor_id: str | None
    last_contact_at: datetime | None
    step_changed_at: datetime | None
    phase: str | None
    step: int | None


@dataclass(frozen=True)
class Event:
    """A job event, as much of it as the row keeps."""

    state: str
    seq: int
    epoch: int | None
    executor_id: str | None
    time: datetime


def on_event(row: JobRow | None, ev: Event) -> JobRow:
    epoch = ev.epoch or 0
    if row is None:
        return JobRow(ev.state, ev.seq, epoch, ev.executor_id, ev.time, ev.time, None, None)
    if ev.seq <= row.event_seq:
        return row
    new_lease = epoch > row.epoch
    return JobRow(
        state=ev.state, event_seq=ev.seq, epoch=max(row.epoch, epoch),
        executor_id=ev.executor_id if ev.executor_id is not None else row.executor_id,
        last_contact_at=ev.time if new_lease else row.last_contact_at,
        step_changed_at=ev.time if new_lease else row.step_changed_at,
        phase=None if new_lease else row.phase, step=None if new_lease else row.step)


def fold_events(row: JobRow | None, events: Iterable[Event]) -> JobRow | None:
    """``on_event`` for each event in turn (the store passes one job's events in sequence order); the row itself
    (``is``) when none landed."""
    for ev in events:
        row = on_event(row, ev)
    return row
