"""The agent's usage sender: a report the server did not acknowledge is sent again unchanged (same message id,
so JetStream keeps one copy), and records leave the backlog only once acknowledged."""

from __future__ import annotations

import pytest

from agents.executor.agent import Agent
from agents.executor.settings import ExecutorSettings

pytestmark = pytest.mark.unit


class FlakyBus:
    def __init__(self, answers: list[bool]) -> None:
        self.answers = answers
        self.sent: list[tuple[str, object]] = []

    async def publish_now(self, subject: str, msg: object, timeout: float | None = None) -> bool:
        self.sent.append((subject, msg))
        return self.answers.pop(0)


async def test_an_unacknowledged_report_is_retried_unchanged_and_kept_until_acknowledged(tmp_path):
    settings = ExecutorSettings.from_env(env={}, executor_id="ex1", node_id="n1", data_dir=tmp_path)
    agent = Agent(settings, nc=None, js=None, gpus=[])
    agent.publisher = bus = FlakyBus([False, True, True])
    agent.meter.start("j", 2, devices=1, now=0.0)
    agent.meter.tick(1.0)
    agent.meter.finish(1.5)
    assert await agent.send_usage() is False  # the server is unreachable: nothing is forgotten
    assert agent.meter.backlog == 2
    agent.meter.start("k", 1, devices=1, now=2.0)
    agent.meter.finish(3.0)  # more usage while the first report waits
    assert await agent.send_usage() is True and agent.meter.backlog == 0
    (subject, first), (_, retry), (_, second) = bus.sent
    assert subject == settings.subjects.usage("ex1")
    assert retry is first and [(r.job_id, r.seq) for r in first.records] == [("j", 1), ("j", 2)]
    assert [(r.job_id, r.seq, r.last) for r in second.records] == [("k", 1, True)]
