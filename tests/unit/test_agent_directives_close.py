"""The agent's directive app stops its broker when cancelled, and a directive task closed without being cancelled
(its event loop ended first: a test, an interpreter exiting) ends quietly instead of trying to await the stop
("coroutine ignored GeneratorExit", seen as an unraisable warning in the suite)."""

from __future__ import annotations

import asyncio

import pytest

from agents.executor import agent as agent_module
from agents.executor.agent import Agent
from agents.executor.settings import ExecutorSettings

pytestmark = pytest.mark.unit


class Broker:
    def __init__(self, *args, **kwargs) -> None:
        self.stopped = 0

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        await asyncio.sleep(0)  # a real stop awaits the subscribers
        self.stopped += 1


@pytest.fixture
def agent(monkeypatch, tmp_path):
    brokers: list[Broker] = []

    def make(*args, **kwargs) -> Broker:
        brokers.append(Broker())
        return brokers[-1]
    monkeypatch.setattr(agent_module, "EdgeBroker", make)
    monkeypatch.setattr(agent_module, "service_app", lambda name, broker: None)
    monkeypatch.setattr(agent_module.directives, "declare", lambda *args, **kwargs: None)
    a = Agent(ExecutorSettings.from_env(env={}, data_dir=tmp_path, executor_id="ex-1"), None, None, [])
    return a, brokers


async def test_cancelled_it_stops_its_broker(agent):
    a, brokers = agent
    task = asyncio.create_task(a.directives())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert brokers[0].stopped == 1


async def test_closed_without_being_cancelled_it_ends_quietly(agent):
    a, brokers = agent
    coro = a.directives()
    assert isinstance(coro.send(None), asyncio.Future)  # started, and waiting for ever on this loop
    coro.close()  # what garbage collection does to a task whose loop is gone: no RuntimeError
    assert brokers[0].stopped == 0
