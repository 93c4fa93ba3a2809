"""How the agent reads a run its guard ended (supervision.py): a run the guard signalled past its deadline is
abandoned (a free requeue, transport loss) even when a renewal acknowledged after the signal moved the lease's
deadline on; a run whose exit was its own stays its own; and a renewal acknowledged while the process was being
started reaches the guard once the process exists, so the guard never holds the deadline from before the start."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from agents.executor import supervision
from agents.executor.agent import Agent
from agents.executor.guard_client import Fence
from agents.executor.lease import Contact
from agents.executor.run import Prepared, Run
from agents.executor.settings import ExecutorSettings
from libs.contracts.leases import LeaseRenewReply
from libs.contracts.telemetry import RunOutcome
from tests.support import builders

pytestmark = pytest.mark.unit


class Child:
    """A started run as supervision uses it: guarded, exiting with ``rc`` once released."""

    def __init__(self, rc: int, fenced: bool) -> None:
        self.pid = 4242
        self.launch = SimpleNamespace(guarded=True)
        self.proc = SimpleNamespace(returncode=None)
        self.rc, self.fenced, self.sandbox = rc, fenced, None
        self.release = asyncio.Event()

    async def wait(self) -> int:
        await self.release.wait()
        self.proc.returncode = self.rc
        return self.rc

    def stderr_tail(self) -> str:
        return ""


class Guard:
    def __init__(self) -> None:
        self.extended: list[tuple[int, Fence]] = []

    async def extend(self, pid: int, fence: Fence) -> bool:
        self.extended.append((pid, fence))
        return True


def _agent(monkeypatch, tmp_path, child: Child) -> tuple[Agent, dict]:
    seen: dict = {"finished": None, "t0": time.monotonic()}

    class Keeper:
        def __init__(self, *args, **kwargs) -> None:
            self.contact = Contact(60.0, 10.0, last_contact=seen["t0"])  # deadline t0 + 50
            self.on_extended = None
            seen["keeper"] = self

        async def acquire(self):
            return LeaseRenewReply(ok=True)

        async def watch(self):
            await asyncio.sleep(3600)
    monkeypatch.setattr(supervision, "LeaseKeeper", Keeper)
    agent = Agent(ExecutorSettings.from_env(env={}, data_dir=tmp_path, executor_id="ex-1"), None, None, [])
    agent.guard = seen["guard"] = Guard()

    async def prepare(run: Run) -> Prepared:
        return Prepared(None, [], None)

    async def launch(run: Run, prepared: Prepared, deadline: float) -> bool:
        seen["launch_deadline"] = deadline()
        # A renewal acknowledged while the process is being started: no process yet to move the fence for.
        keeper = seen["keeper"]
        keeper.contact.acknowledged(seen["t0"] + 20.0)  # deadline t0 + 70
        await keeper.on_extended(keeper.contact.deadline)
        run.child = child
        return True

    async def finish(run: Run, outcome: RunOutcome, rc, error) -> None:
        seen["finished"] = (outcome, rc, error)
    agent._prepare, agent._launch, agent._finish = prepare, launch, finish
    agent._watch_ceiling = agent._watch_disk = lambda run: None
    return agent, seen


async def _serve(agent: Agent, child: Child, between=None) -> None:
    task = asyncio.create_task(agent._serve_grant(Run(builders.grant())))
    for _ in range(100):  # until the run waits on its process
        await asyncio.sleep(0)
    if between is not None:
        await between()
    child.release.set()
    await asyncio.wait_for(task, 5)


async def test_a_run_the_guard_signalled_is_abandoned_though_a_later_renewal_moved_the_deadline_on(monkeypatch,
                                                                                                 tmp_path):
    child = Child(143, fenced=True)
    agent, seen = _agent(monkeypatch, tmp_path, child)

    async def late_renewal() -> None:  # acknowledged after the guard's SIGTERM, before the exit is seen
        seen["keeper"].contact.acknowledged(seen["t0"] + 40.0)
        await seen["keeper"].on_extended(seen["keeper"].contact.deadline)
    await _serve(agent, child, late_renewal)
    outcome, rc, error = seen["finished"]
    assert (outcome, rc) == (RunOutcome.ABANDONED, 143)
    assert error.startswith(supervision.FENCED)


async def test_a_run_that_exited_by_itself_is_its_own_outcome(monkeypatch, tmp_path):
    child = Child(143, fenced=False)
    agent, seen = _agent(monkeypatch, tmp_path, child)
    await _serve(agent, child)
    outcome, rc, _ = seen["finished"]
    assert (outcome, rc) == (RunOutcome.FAILED, 143)


async def test_a_renewal_acknowledged_during_the_start_reaches_the_guard_once_the_process_exists(monkeypatch,
                                                                                               tmp_path):
    child = Child(0, fenced=False)
    agent, seen = _agent(monkeypatch, tmp_path, child)
    await _serve(agent, child)
    t0 = seen["t0"]
    assert seen["launch_deadline"] == t0 + 50.0  # what the guard was started with
    grace = agent.settings.abandon_grace_seconds
    assert seen["guard"].extended == [(4242, Fence(until=t0 + 70.0, grace=grace))]
    assert seen["finished"][0] is RunOutcome.SUCCEEDED
