"""A consumer with ``linger_seconds`` (libs/runtime/edge.py) waits that long before fetching again after a batch
that came short, so what arrives meanwhile is one batch (one transaction) instead of many; after a full batch
(a backlog) or an empty fetch it asks at once, and without it nothing waits. Batches are still handled in order
and every message is acknowledged; at shutdown a lingering fetch is simply stopped."""

from __future__ import annotations

import asyncio

import pytest

from libs.runtime.edge import linger_before_next
from tests.support.edgefakes import Recorder, loop
from tests.support.edgescript import POLL, ScriptedSub, batches, run_until, stop
from tests.support.services import eventually

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("fetched", "batch", "linger", "expected"), [
    (1, 100, 0.2, 0.2), (99, 100, 0.2, 0.2),  # short: more may be on the way
    (100, 100, 0.2, 0.0),  # full: a backlog, drain it at full speed
    (0, 100, 0.2, 0.0),  # nothing came: the next fetch waits for a first message anyway
    (1, 100, 0.0, 0.0), (1, 1, 0.2, 0.0),  # no linger; a batch of one is always full
])
def test_the_pause_before_the_next_fetch(fetched, batch, linger, expected):
    assert linger_before_next(fetched, batch, linger) == expected


class TimedSub(ScriptedSub):
    """Records when each fetch was asked for."""

    def __init__(self, *batches_) -> None:
        super().__init__(*batches_)
        self.asked: list[float] = []

    async def fetch(self, batch: int, timeout: float):
        self.asked.append(asyncio.get_running_loop().time())
        return await super().fetch(batch, timeout)


@pytest.mark.parametrize("read_ahead", [False, True])
async def test_after_a_short_batch_the_next_fetch_waits_and_after_a_full_one_it_does_not(read_ahead):
    handled = Recorder()
    sub = TimedSub(*batches("a,b,c", "d", "e,f,g"))  # full (batch 3), short, full
    edge, _ = loop(handled, batch=3, linger_seconds=0.3, read_ahead=read_ahead)
    edge._sub = sub
    msgs = [m for b in sub.batches for m in b]
    task = await run_until(edge, lambda: all(m.settled for m in msgs))
    await eventually(lambda: len(sub.asked) == 4, every=POLL)  # the fetch after the last batch (full: asked at once)
    await stop(task)
    gaps = [b - a for a, b in zip(sub.asked, sub.asked[1:])]
    assert gaps[0] < 0.2  # after the full first batch: at once
    assert gaps[1] >= 0.29  # after the short second one: lingered
    assert gaps[2] < 0.2  # after the full third: at once
    assert handled.calls == [["a", "b", "c"], ["d"], ["e", "f", "g"]]
    assert [m.outcome for m in msgs] == ["ack"] * 7


async def test_without_linger_the_next_fetch_is_asked_at_once():
    sub = TimedSub(*batches("a", "b"))
    edge, _ = loop(Recorder(), batch=3)
    edge._sub = sub
    task = await run_until(edge, lambda: len(sub.asked) == 3)
    await stop(task)
    assert max(b - a for a, b in zip(sub.asked, sub.asked[1:])) < 0.2


async def test_at_shutdown_a_lingering_fetch_is_stopped_and_nothing_is_left_unsettled():
    sub = TimedSub(*batches("a", "b"))
    edge, _ = loop(Recorder(), batch=3, linger_seconds=3600)
    edge._sub = sub
    first = sub.batches[0]
    task = await run_until(edge, lambda: all(m.settled for m in first))
    await stop(task)
    assert len(sub.asked) == 1 and sub.unsubscribed  # the second fetch never asked: "b" stays in the stream
