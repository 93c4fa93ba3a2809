"""The quick fetch (libs/runtime/quickfetch.py) on a real NATS: a quickened pull subscription returns the same
messages, in stream order, as nats-py's own fetch; a fetch that finds nothing times out as nats-py's does; a
message published while a fetch waits is still delivered; and the edge's subscriptions are quickened."""

from __future__ import annotations

import asyncio

import pytest

from libs.runtime import quickfetch
from libs.runtime.edge import Consumer
from libs.runtime.edge_loop import ConsumerLoop
from libs.runtime.service import Runtime

pytestmark = pytest.mark.integration


async def _subs(rt: Runtime, n: int):
    s = rt.subjects
    for i in range(n):
        await rt.js.publish(s.heartbeat("qf"), f"m{i}".encode())
    plain = await rt.js.pull_subscribe(s.heartbeat("qf"), durable="qf-plain", stream=s.stream_name("HB"))
    quick = await rt.js.pull_subscribe(s.heartbeat("qf"), durable="qf-quick", stream=s.stream_name("HB"))
    assert quickfetch.quicken(quick)
    return plain, quick


async def drain(sub, batch: int) -> list[bytes]:
    got: list[bytes] = []
    while True:
        try:
            msgs = await sub.fetch(batch, timeout=0.5)
        except asyncio.TimeoutError:  # nats-py's own (a subclass) or asyncio's, whichever timer fires first
            return got
        for m in msgs:
            await m.ack()
        got += [m.data for m in msgs]


async def test_a_quickened_fetch_returns_what_nats_py_returns_in_the_same_order(env):
    rt = await Runtime.open("qf", env.settings(), schema=None, package=None)
    try:
        plain, quick = await _subs(rt, 250)
        expected = [f"m{i}".encode() for i in range(250)]
        assert await drain(plain, 64) == expected
        assert await drain(quick, 64) == expected  # batches of 64: full ones from the queue, a short last one
        info = await rt.js.consumer_info(rt.subjects.stream_name("HB"), "qf-quick")
        assert info.num_ack_pending == 0 and info.num_pending == 0
    finally:
        await rt.close()


async def test_an_empty_quick_fetch_times_out_and_a_later_message_still_arrives(env):
    rt = await Runtime.open("qf", env.settings(), schema=None, package=None)
    try:
        _, quick = await _subs(rt, 0)
        with pytest.raises(asyncio.TimeoutError):  # nats.errors.TimeoutError is one too
            await quick.fetch(10, timeout=0.3)

        async def later() -> None:
            await asyncio.sleep(0.2)
            await rt.js.publish(rt.subjects.heartbeat("qf"), b"late")

        task = asyncio.create_task(later())
        msgs = await quick.fetch(10, timeout=3)
        await task
        assert [m.data for m in msgs] == [b"late"]
    finally:
        await rt.close()


async def test_the_edge_quickens_its_subscriptions(env):
    rt = await Runtime.open("qf", env.settings(), schema=None, package=None)
    try:
        async def handle(_: list[bytes]) -> None:
            return None

        consumer = Consumer(rt.subjects.heartbeat("qf"), "HB", "qf-edge", bytes, handle)
        loop = ConsumerLoop(rt.js, rt.subjects, consumer, rt)
        await loop.subscribe()
        assert loop._sub._sub.next_msg.__qualname__.startswith("quicken.")
        await loop._sub.unsubscribe()
    finally:
        await rt.close()


def test_a_subscription_quickfetch_does_not_know_is_left_as_it_is():
    class Odd:
        _sub = object()

    assert not quickfetch.quicken(Odd())
    assert not quickfetch.quicken(object())
