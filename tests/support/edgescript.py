"""A scripted pull subscription and the helpers that run ``ConsumerLoop.run`` on it (tests/unit/test_edge_prefetch.py,
tests/unit/test_edge_read_ahead.py)."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.edgefakes import FakeMsg
from tests.support.services import eventually


class ScriptedSub:
    """A pull subscription that hands out the given batches, one per fetch, then waits like an empty stream."""

    def __init__(self, *batches: list[FakeMsg], fail_first: BaseException | None = None) -> None:
        self.batches = list(batches)
        self.fetches = 0
        self.fail_first = fail_first
        self.unsubscribed = False

    async def fetch(self, batch: int, timeout: float) -> list[FakeMsg]:
        self.fetches += 1
        if self.fail_first is not None:
            exc, self.fail_first = self.fail_first, None
            raise exc
        if self.batches:
            return self.batches.pop(0)
        await asyncio.Event().wait()
        return []

    async def unsubscribe(self) -> None:
        self.unsubscribed = True


def batches(*bodies: str) -> list[list[FakeMsg]]:
    return [[FakeMsg(b.encode(), seq=i) for i, b in enumerate(body.split(","))] for body in bodies]


# The scripted loop reacts within a few milliseconds: poll as often, so a test stops it as soon as it may.
POLL = 0.005


async def run_until(edge, condition) -> asyncio.Task:
    task = asyncio.create_task(edge.run())
    await eventually(condition, timeout=5.0, what="the loop to reach the condition", every=POLL)
    return task


async def stop(task: asyncio.Task) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
