"""The agent prepares a run (its checkpoint, its sandbox) while the queue confirms the grant's lease, one round trip
each, instead of one after the other; a grant that is not confirmed, or an agent stopped meanwhile, leaves nothing
of the preparation behind (the sandbox is closed: uid released, cgroup and directories removed)."""

from __future__ import annotations

import asyncio

import pytest

from agents.executor import supervision
from agents.executor.agent import Agent
from agents.executor.lease import Contact
from agents.executor.run import Prepared, Run
from agents.executor.settings import ExecutorSettings
from libs.contracts.leases import LeaseRenewReply
from tests.support import builders

pytestmark = pytest.mark.unit


class Box:
    def __init__(self) -> None:
        self.closed = 0

    async def close(self) -> None:
        self.closed += 1


@pytest.fixture
def seen(monkeypatch, tmp_path):
    """The order things happened in, with an agent whose lease answers ``seen["answer"]`` after 50 ms."""
    seen: dict = {"order": [], "answer": LeaseRenewReply(ok=True), "box": Box(), "launched": None}

    class Keeper:
        def __init__(self, *args, **kwargs) -> None:
            self.contact = Contact(60.0, 10.0, last_contact=0.0)
            self.on_extended = None

        async def acquire(self):
            seen["order"].append("confirming")
            await asyncio.sleep(0.05)
            seen["order"].append("confirmed" if seen["answer"].ok else "refused")
            return seen["answer"]

        async def watch(self):
            await asyncio.sleep(3600)
    monkeypatch.setattr(supervision, "LeaseKeeper", Keeper)
    agent = Agent(ExecutorSettings.from_env(env={}, data_dir=tmp_path, executor_id="ex-1"), None, None, [])

    async def prepare(run: Run) -> Prepared:
        seen["order"].append("preparing")
        await asyncio.sleep(0.02)
        seen["order"].append("prepared")
        return Prepared(None, [], seen["box"])

    async def launch(run: Run, prepared: Prepared, deadline: float) -> bool:
        seen["launched"] = prepared
        return False  # as a stop that came first: the run ends here
    agent._prepare, agent._launch = prepare, launch
    seen["agent"] = agent
    return seen


async def test_the_run_is_prepared_while_its_lease_is_confirmed_and_launched_with_it(seen):
    await seen["agent"]._serve_grant(Run(builders.grant()))
    assert seen["order"].index("preparing") < seen["order"].index("confirmed")
    assert seen["order"].index("prepared") < seen["order"].index("confirmed")  # overlapped, not in turn
    assert seen["launched"] == Prepared(None, [], seen["box"])
    assert seen["box"].closed == 0  # the launch owns it now


async def test_a_grant_not_confirmed_starts_nothing_and_its_sandbox_is_closed(seen):
    seen["answer"] = LeaseRenewReply(ok=False, reason="stale epoch")
    await seen["agent"]._serve_grant(Run(builders.grant()))
    assert seen["launched"] is None and seen["box"].closed == 1


async def test_an_agent_stopped_while_the_lease_is_confirmed_closes_the_sandbox(seen):
    task = asyncio.create_task(seen["agent"]._serve_grant(Run(builders.grant())))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen["launched"] is None and seen["box"].closed == 1


async def test_a_preparation_that_failed_is_reported_once_and_leaves_nothing(seen):
    failed: list = []

    async def prepare(run: Run) -> Prepared:
        raise OSError("no uid free")

    async def fail(run: Run, exc: Exception) -> None:
        failed.append(str(exc))
    seen["agent"]._prepare, seen["agent"]._fail = prepare, fail
    await seen["agent"]._serve_grant(Run(builders.grant()))
    assert failed == ["no uid free"] and seen["launched"] is None
