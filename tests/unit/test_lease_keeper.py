"""The executor's lease keeper against a stand-in for the queue's renewal responder: the renewal that acquires
the lease is not repeated at once by the watch that follows it (the next one is a heartbeat later), and a
watch without an acquired lease renews at once."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from types import SimpleNamespace

import pytest

from agents.executor.lease import LeaseKeeper
from libs.contracts.envelope import utcnow
from libs.contracts.leases import LeaseRenewReply
from tests.support.services import eventually

pytestmark = pytest.mark.unit


class Queue:
    """Answers every renewal ok and counts them."""

    def __init__(self) -> None:
        self.requests = 0

    async def request(self, subject: str, data: bytes, timeout: float):
        self.requests += 1
        return SimpleNamespace(data=LeaseRenewReply(ok=True, expires_at=utcnow() + timedelta(seconds=6)).encode())


def keeper(queue: Queue, heartbeat: float) -> LeaseKeeper:
    return LeaseKeeper(queue, "t.rpc.lease.renew.ex", job_id="j1", epoch=1, executor_id="ex", lease_seconds=60.0,
                       heartbeat_seconds=heartbeat, stop_margin_seconds=5.0)


async def test_the_acquiring_renewal_is_not_repeated_at_once_by_the_watch():
    queue = Queue()
    k = keeper(queue, heartbeat=30.0)
    assert (await k.acquire()).ok and queue.requests == 1
    watch = asyncio.create_task(k.watch())
    try:
        for _ in range(20):  # the watch task runs many times over; it sends nothing before a heartbeat
            await asyncio.sleep(0.005)
        assert queue.requests == 1
    finally:
        watch.cancel()


async def test_the_watch_renews_a_heartbeat_after_the_acquiring_renewal():
    queue = Queue()
    k = keeper(queue, heartbeat=0.2)
    await k.acquire()
    watch = asyncio.create_task(k.watch())
    try:
        await eventually(lambda: queue.requests >= 3, timeout=30.0)  # and every heartbeat after
        assert k.renewals >= 3 and not watch.done()
    finally:
        watch.cancel()


async def test_a_watch_without_an_acquired_lease_renews_at_once():
    queue = Queue()
    k = keeper(queue, heartbeat=30.0)
    watch = asyncio.create_task(k.watch())
    try:
        await eventually(lambda: queue.requests == 1, timeout=30.0)
        assert k.renewals == 1
    finally:
        watch.cancel()
