"""Usage metering: device-seconds from a training process's start to its exit, as numbered usage records.

Each record covers the wall time since the previous one for one (job, epoch), numbered from 1, so the budget
service charges a redelivered record once. Records wait in a backlog, oldest first, until the server
acknowledged them: a partition or an outage delays usage, never loses it. The backlog is bounded without
dropping time: when it is full, no new record is cut and the running stretch simply grows (one record then
covers the whole wait, up to a day); only a process's exit always cuts its last stretch. Pure: the clock
(monotonic seconds, and optionally the wall-clock time at start) is an argument.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from libs.contracts.usage import UsageRecord

MAX_BACKLOG = 10_000  # records (about 3 MB): 83 hours of a 30 s interval before stretches start to grow
MAX_STRETCH_SECONDS = 86_400.0  # a full backlog still cuts a record a day (the contract bounds one record)


@dataclass
class _Run:
    job_id: str
    epoch: int
    devices: int
    since: float  # monotonic start of the open stretch
    since_at: datetime | None  # wall-clock time at ``since``, when the caller gave one
    seq: int = 0


class UsageMeter:
    def __init__(self, max_backlog: int = MAX_BACKLOG) -> None:
        self._run: _Run | None = None
        self._pending: deque[UsageRecord] = deque()
        self.max_backlog = max_backlog

    @property
    def running(self) -> bool:
        return self._run is not None

    def start(self, job_id: str, epoch: int, devices: int, now: float, at: datetime | None = None) -> None:
        """The process started (``now`` monotonic, ``at`` the wall clock then): its time counts from here."""
        if self._run is not None:
            self.finish(now)
        self._run = _Run(job_id, epoch, max(1, devices), since=now, since_at=at)

    def _cut(self, now: float, last: bool = False) -> None:
        run = self._run
        assert run is not None
        run.seq += 1
        wall = max(0.0, now - run.since)
        ended_at = None if run.since_at is None else run.since_at + timedelta(seconds=wall)
        self._pending.append(UsageRecord(job_id=run.job_id, epoch=run.epoch, seq=run.seq, devices=run.devices,
                                         wall_seconds=wall, started_at=run.since_at, ended_at=ended_at,
                                         last=last))
        run.since, run.since_at = now, ended_at

    def tick(self, now: float) -> None:
        """Cut the running process's time since the last record (each report interval)."""
        run = self._run
        if run is None:
            return
        if len(self._pending) < self.max_backlog or now - run.since >= MAX_STRETCH_SECONDS:
            self._cut(now)

    def finish(self, now: float) -> None:
        """The process ended: its last stretch of time becomes a final record, whatever the backlog."""
        if self._run is not None:
            self._cut(now, last=True)
            self._run = None

    def due(self, limit: int) -> list[UsageRecord]:
        """The oldest unacknowledged records, at most ``limit`` (left in the backlog until acknowledged)."""
        return [self._pending[i] for i in range(min(limit, len(self._pending)))]

    def next_sample(self, now: float) -> UsageRecord | None:
        """The oldest unacknowledged record; a fresh cut first while running if there is none."""
        if not self._pending:
            self.tick(now)
        return self._pending[0] if self._pending else None

    def acknowledged(self, records: UsageRecord | Sequence[UsageRecord] | None) -> None:
        """The server has these (the oldest ones, as ``due`` gave them): forget them."""
        if records is None:
            return
        for record in [records] if isinstance(records, UsageRecord) else records:
            if self._pending and self._pending[0] is record:
                self._pending.popleft()

    @property
    def backlog(self) -> int:
        return len(self._pending)
