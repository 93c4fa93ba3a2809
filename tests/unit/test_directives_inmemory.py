"""The agent's directive consumer (agents/executor/directives.py) on FastStream's in-memory ``TestNatsBroker``
(no server), handing each directive to the real ``Agent`` found in the broker's context: a directive it cannot
act on is refused visibly (``teto.rejected.executor``), a grant addressed to another executor is never run, a
stop for a job not running here changes nothing, and a handler that fails on one directive still gets the next."""

from __future__ import annotations

from typing import Any

import pytest
from faststream.nats import TestNatsBroker

from agents.executor import directives
from agents.executor.agent import Agent
from agents.executor.settings import ExecutorSettings
from libs.contracts.agents import RunJob, StopJob
from libs.contracts.envelope import RejectedMessage
from libs.runtime.edge_stream import EdgeBroker

pytestmark = pytest.mark.unit


class RecordingStream:
    """JetStream as the agent's publisher sees it: what was published, acknowledged at once."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, payload: bytes = b"", **_: Any) -> None:
        self.published.append((subject, payload))


def directed(agent: Any) -> EdgeBroker:
    broker = EdgeBroker()
    directives.declare(broker, agent.subjects, agent.subjects.agent_all_of(agent.id), f"agent-{agent.id}",
                       directives.on_directive, agent=agent)  # as Agent.directives declares it
    return broker


def real_agent() -> tuple[Agent, RecordingStream]:
    js = RecordingStream()
    return Agent(ExecutorSettings.from_env(env={"TETO_EXECUTOR_ID": "ex1"}), None, js, []), js  # type: ignore[arg-type]


def refusals(js: RecordingStream, agent: Agent) -> list[RejectedMessage]:
    return [RejectedMessage.decode(body) for subject, body in js.published
            if subject == agent.subjects.rejected("executor")]


async def test_an_unknown_directive_and_a_grant_for_another_executor_are_refused_visibly():
    agent, js = real_agent()
    s = agent.subjects
    grant = RunJob(job_id="job-1", epoch=1, executor_id="ex2", spec={"workload": {"kind": "finetune"}}, attempt=1,
                   lease_seconds=30, heartbeat_seconds=5).encode()
    async with TestNatsBroker(directed(agent)) as bus:
        await bus.publish(b"{}", s.agent("ex1", "teleport"))
        await bus.publish(grant, s.agent("ex1", "run"))
    first, second = refusals(js, agent)
    assert first.subject == s.agent("ex1", "teleport") and "unknown directive" in first.reason
    assert second.subject == s.agent("ex1", "run") and "addressed to executor 'ex2'" in second.reason
    assert agent.rejected == 2 and agent.run is None


async def test_a_stop_for_a_job_not_running_here_changes_nothing():
    agent, js = real_agent()
    async with TestNatsBroker(directed(agent)) as bus:
        await bus.publish(StopJob(job_id="job-9", epoch=1, reason="cancelled").encode(),
                          agent.subjects.agent("ex1", "stop"))
    assert agent.rejected == 0 and agent.stale_messages == 0 and refusals(js, agent) == []


async def test_a_directive_whose_handling_fails_does_not_stop_the_next():
    class Flaky:
        subjects, id = real_agent()[0].subjects, "ex1"

        def __init__(self) -> None:
            self.seen: list[str] = []

        async def on_directive(self, msg: Any) -> None:
            self.seen.append(msg.subject)
            if len(self.seen) == 1:
                raise RuntimeError("a hostile directive")

    agent = Flaky()
    async with TestNatsBroker(directed(agent)) as bus:
        for kind in ("stop", "run"):
            await bus.publish(b"{}", agent.subjects.agent("ex1", kind))
    assert agent.seen == [agent.subjects.agent("ex1", "stop"), agent.subjects.agent("ex1", "run")]
