"""The agent's usage reports (agents/executor/usage.py): a report the server did not acknowledge is sent again unchanged (same message id,
so JetStream keeps one copy), and records leave the backlog only once acknowledged."""

from __future__ import annotations

import pytest

from agents.executor.usage import UsageReports
from libs.contracts.subjects import Subjects

pytestmark = pytest.mark.unit


class FlakyBus:
    def __init__(self, answers: list[bool]) -> None:
        self.answers = answers
        self.sent: list[tuple[str, object]] = []

    async def publish_now(self, subject: str, msg: object, timeout: float | None = None) -> bool:
        self.sent.append((subject, msg))
        return self.answers.pop(0)


async def test_an_unacknowledged_report_is_retried_unchanged_and_kept_until_acknowledged():
    bus = FlakyBus([False, True, True])
    usage = UsageReports(bus, Subjects(), "ex1", "n1", interval_seconds=1.0)  # type: ignore[arg-type]
    usage.meter.start("j", 2, devices=1, now=0.0)
    usage.meter.tick(1.0)
    usage.meter.finish(1.5)
    assert await usage.send() is False  # the server is unreachable: nothing is forgotten
    assert usage.meter.backlog == 2
    usage.meter.start("k", 1, devices=1, now=2.0)
    usage.meter.finish(3.0)  # more usage while the first report waits
    assert await usage.send() is True and usage.meter.backlog == 0
    (subject, first), (_, retry), (_, second) = bus.sent
    assert subject == Subjects().usage("ex1")
    assert retry is first and [(r.job_id, r.seq) for r in first.records] == [("j", 1), ("j", 2)]
    assert [(r.job_id, r.seq, r.last) for r in second.records] == [("k", 1, True)]
