"""How heartbeats land on a row of health's tables (an executor's, or a job's contact), one by one, and the fold
that applies a whole batch of them at once with the same result.

The rule for one heartbeat (what health's per-heartbeat upserts did):
- a heartbeat older than the row's last one (``at``) is ignored: it was delivered late or out of order; for a
  job, one about an older lease epoch than the row's is ignored too (a zombie of a replaced lease);
- otherwise its columns replace the row's, and the stuck clock (``step_changed_at``) restarts at its time when
  what it reports about progress (step, phase, and the job and epoch it names) differs from the row's, or the
  row has no stuck clock yet; else the clock keeps running.

``fold`` is that rule applied to each heartbeat in turn: a batch holding several heartbeats of one row (a
checkpointing -> training flap, a standing step then a moved one) comes out as if they had been written one by
one in that order, so the store can write one statement per batch instead of one per heartbeat.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True)
class Beat:
    """One heartbeat as it lands on one row."""

    at: datetime  # its send time (clamped to the service's clock)
    epoch: int  # the lease epoch it names (0: none)
    progress: Hashable  # what, when it changes, restarts the stuck clock
    columns: tuple  # every other column it sets, as the store lays them out


@dataclass(frozen=True, slots=True)
class Contact:
    """What the heartbeats (and, for a job, its events) have left on a row."""

    at: datetime | None  # last heartbeat applied (a job: last contact, a lease grant counts)
    epoch: int  # the row's lease epoch (an executor: the last heartbeat's; 0 for none)
    progress: Hashable  # as in Beat; None before any heartbeat
    step_changed_at: datetime | None
    columns: tuple  # as in Beat; () before any heartbeat, or when read back (only the newest's are written)


def land(row: Contact | None, beat: Beat, *, fenced: bool) -> Contact:
    """The row after one heartbeat (``row`` None: no row yet). ``fenced``: a heartbeat about an older lease epoch
    than the row's never lands (jobs; an executor's epoch is only what its last heartbeat said)."""
    if row is not None:
        if row.at is not None and beat.at < row.at:
            return row
        if fenced and beat.epoch < row.epoch:
            return row
    restart = row is None or row.step_changed_at is None or row.progress != beat.progress
    return Contact(at=beat.at, epoch=beat.epoch, progress=beat.progress,
                   step_changed_at=beat.at if restart else row.step_changed_at, columns=beat.columns)


def fold(row: Contact | None, beats: Iterable[Beat], *, fenced: bool) -> Contact | None:
    """``land`` each heartbeat in turn (the store passes them oldest first, in stream order within a send time).
    The row itself (``is``) when none landed."""
    for beat in beats:
        row = land(row, beat, fenced=fenced)
    return row
