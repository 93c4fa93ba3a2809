"""stop_tasks stops a task that swallows its cancellation (as nats-py's publish path does), and says which task
did not stop within its bound instead of hanging."""

from __future__ import annotations

import asyncio

import pytest

from libs.runtime.tasks import stop_tasks

pytestmark = pytest.mark.unit


async def test_a_task_that_swallows_one_cancel_is_cancelled_again_until_it_ends():
    swallowed = []

    async def publish_loop():
        while True:
            try:
                await asyncio.sleep(0.05)  # stands for nats-py's flush: CancelledError caught and dropped
            except asyncio.CancelledError:
                if not swallowed:
                    swallowed.append(1)
                    continue
                raise

    task = asyncio.create_task(publish_loop())
    await asyncio.sleep(0)
    assert await stop_tasks([task], timeout=5) == [] and task.cancelled() and swallowed == [1]


async def test_a_task_that_never_stops_is_returned_after_the_bound_not_waited_on_forever():
    released = asyncio.Event()

    async def deaf():
        while not released.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(deaf(), name="deaf")
    await asyncio.sleep(0)
    assert await stop_tasks([task], timeout=0.5) == [task] and not task.done()
    released.set()  # let it end, so it does not outlive the test
    await task
