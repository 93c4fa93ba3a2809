"""The agent's usage reports: records of the training processes' running time (measured by the UsageMeter)
sent on their own durable subject, ``teto.usage.<executor_id>``, oldest first. Heartbeats carry none (they are
for liveness and kept an hour). A report is retried unchanged (same message id) until JetStream acknowledged it,
so an outage or a partition delays usage and never loses it."""

from __future__ import annotations

import asyncio
import contextlib
import time

from libs.contracts.subjects import Subjects
from libs.contracts.usage import MAX_RECORDS_PER_REPORT, UsageReport

from .heartbeat import UsageMeter
from .publisher import Publisher


class UsageReports:
    def __init__(self, publisher: Publisher, subjects: Subjects, executor_id: str, node_id: str,
                 interval_seconds: float) -> None:
        self.publisher = publisher
        self.subjects = subjects
        self.executor_id = executor_id
        self.node_id = node_id
        self.interval_seconds = interval_seconds
        self.meter = UsageMeter()
        self.due = asyncio.Event()  # a process ended: send its last record now, not at the next tick
        self._report: UsageReport | None = None  # in flight: retried unchanged until acknowledged

    async def run(self) -> None:
        while True:
            self.meter.tick(time.monotonic())
            await self.send()
            self.due.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.due.wait(), self.interval_seconds)

    async def send(self) -> bool:
        """Send the backlog in reports; False when the server did not acknowledge one (kept for later)."""
        while self.meter.backlog:
            if self._report is None:
                self._report = UsageReport(executor_id=self.executor_id, node_id=self.node_id,
                                           records=self.meter.due(MAX_RECORDS_PER_REPORT))
            report = self._report
            if not await self.publisher.publish_now(self.subjects.usage(self.executor_id), report,
                                                    timeout=self.interval_seconds):
                return False
            self.meter.acknowledged(report.records)
            self._report = None
        return True

    def finish(self) -> None:
        """A process ended: close its stretch and send its last record now."""
        self.meter.finish(time.monotonic())
        self.due.set()
