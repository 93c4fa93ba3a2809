"""A grant placed on the agent's report of its run's end (services/queue/runs.py frees the executor on that
report) can reach the agent before the report's acknowledgement does, while the agent still holds the ended run:
it waits for the run to be let go and is then taken, not handed back (a hand-back would requeue the job and cost
a placement). A grant while a run is still going is handed back as before; the same grant again is ignored."""

from __future__ import annotations

import asyncio

import pytest

from agents.executor.agent import Agent
from agents.executor.run import Run
from agents.executor.settings import ExecutorSettings
from tests.support import builders
from tests.support.services import eventually

pytestmark = pytest.mark.unit


@pytest.fixture
def agent(tmp_path):
    agent = Agent(ExecutorSettings.from_env(env={}, data_dir=tmp_path, executor_id="ex-1"), None, None, [])
    agent.served, agent.handed = [], []

    async def serve(run: Run) -> None:
        agent.served.append(run.grant.job_id)

    agent._serve_traced = serve
    agent._hand_back = lambda g, why: agent.handed.append((g.job_id, why))
    return agent


def holding(agent: Agent, run: Run) -> asyncio.Event:
    """The agent serves ``run`` until the returned event is set (as ``_serve_grant`` lets it go at its end)."""
    let_go = asyncio.Event()

    async def serving() -> None:
        await let_go.wait()
        agent.run = None

    agent.run, agent.job_task = run, asyncio.create_task(serving())
    return let_go


async def test_a_grant_while_the_ended_runs_report_is_acknowledged_waits_for_it_then_runs(agent):
    let_go = holding(agent, Run(builders.grant(job_id="old"), ended=True))
    agent.on_run(builders.grant(job_id="new"))
    await asyncio.sleep(0.05)
    assert agent.handed == [] and agent.served == [] and agent.run.grant.job_id == "old"
    let_go.set()
    await eventually(lambda: agent.served, timeout=1.0, what="the new grant to be served", every=0.01)
    assert agent.served == ["new"] and agent.handed == [] and agent.run.grant.job_id == "new"


async def test_a_grant_while_a_run_goes_on_is_handed_back_and_the_same_grant_again_is_ignored(agent):
    let_go = holding(agent, Run(builders.grant(job_id="old")))
    agent.on_run(builders.grant(job_id="old"))  # redelivered
    agent.on_run(builders.grant(job_id="new"))
    await asyncio.sleep(0.05)
    assert agent.handed == [("new", "the executor is busy with job old")] and agent.served == []
    ended = Run(builders.grant(job_id="old"), ended=True)
    agent.run = ended
    agent.on_run(builders.grant(job_id="old"))  # the ended run's own grant again: never run twice
    let_go.set()
    await asyncio.sleep(0.05)
    assert agent.served == [] and len(agent.handed) == 1


async def test_a_grant_waiting_for_an_ended_run_goes_back_when_the_agent_shuts_down(agent):
    holding(agent, Run(builders.grant(job_id="old"), ended=True))
    agent.on_run(builders.grant(job_id="new"))
    agent.job_task.cancel()  # shutdown cancels the run's task
    await eventually(lambda: agent.handed, timeout=1.0, what="the waiting grant to be handed back", every=0.01)
    assert agent.handed == [("new", "the executor is shutting down")] and agent.served == []
