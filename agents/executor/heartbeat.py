"""Usage accounting for heartbeats: device-seconds while a training process runs, as numbered samples.

Each sample covers the wall time since the previous one for one (job, epoch), numbered from 1, so the budget
service counts a redelivered sample once. A sample whose heartbeat was not acknowledged is sent again unchanged
(same seq) rather than lost; time keeps accruing into the next one. Pure: the clock is an argument.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from libs.contracts.telemetry import UsageSample


@dataclass
class _Run:
    job_id: str
    epoch: int
    devices: int
    since: float
    seq: int = 0


class UsageMeter:
    def __init__(self) -> None:
        self._run: _Run | None = None
        self._pending: deque[UsageSample] = deque()

    @property
    def running(self) -> bool:
        return self._run is not None

    def start(self, job_id: str, epoch: int, devices: int, now: float) -> None:
        if self._run is not None:
            self.finish(now)
        self._run = _Run(job_id, epoch, max(1, devices), since=now)

    def _cut(self, now: float) -> None:
        run = self._run
        assert run is not None
        run.seq += 1
        self._pending.append(UsageSample(job_id=run.job_id, epoch=run.epoch, seq=run.seq, devices=run.devices,
                                         wall_seconds=max(0.0, now - run.since)))
        run.since = now

    def finish(self, now: float) -> None:
        """The process ended: its last stretch of time becomes a final sample, sent with the next heartbeat."""
        if self._run is not None:
            self._cut(now)
            self._run = None

    def next_sample(self, now: float) -> UsageSample | None:
        """The sample the next heartbeat carries: an unacknowledged one first, else a fresh cut while running."""
        if not self._pending and self._run is not None:
            self._cut(now)
        return self._pending[0] if self._pending else None

    def acknowledged(self, sample: UsageSample | None) -> None:
        if sample is not None and self._pending and self._pending[0] is sample:
            self._pending.popleft()

    @property
    def backlog(self) -> int:
        return len(self._pending)
