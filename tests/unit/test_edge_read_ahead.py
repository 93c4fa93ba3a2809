"""A consumer with ``read_ahead`` (libs/runtime/edge.py, ``Consumer.read_ahead``) reads the batch fetched ahead while
the current one is handled, yet handles batches one at a time in fetch order; a held batch (outage) keeps the one
read behind it; a poison message is still isolated and dead-lettered alone; at shutdown the batch read but not
handled is handed back at once, and the batch being handled is never acknowledged unless its handler returned."""

from __future__ import annotations

import asyncio

import pytest

from libs.runtime.errors import PermanentError
from tests.support.edgefakes import decode, loop
from tests.support.edgescript import POLL, ScriptedSub, batches, run_until, stop
from tests.support.services import eventually

pytestmark = pytest.mark.unit


def journaled(journal: list[tuple[str, object]], handle_delay: float = 0.02, fail=None):
    """A reader and a handler that write what they do, in order, to ``journal``."""
    def read(m) -> str:
        journal.append(("read", m.data.decode()))
        return decode(m.data)

    async def handle(items: list[str]) -> None:
        journal.append(("start", items))
        await asyncio.sleep(handle_delay)  # the handler's database round trips
        if fail is not None:
            fail(items)
        journal.append(("end", items))

    return read, handle


def read_ahead_loop(journal, sub: ScriptedSub, **kw):
    read, handle = journaled(journal, **{k: kw.pop(k) for k in ("handle_delay", "fail") if k in kw})
    edge, reporter = loop(handle, **kw)
    edge.consumer = type(edge.consumer)(**{**edge.consumer.__dict__, "decode": None, "read": read,
                                            "read_ahead": True})
    edge._sub = sub
    return edge, reporter


@pytest.mark.parametrize("read_ahead", [True, False])
async def test_the_batch_ahead_is_read_while_the_current_one_is_handled_and_handling_stays_in_order(read_ahead):
    journal: list[tuple[str, object]] = []
    sub = ScriptedSub(*batches("a1,b1", "a2,b2", "a3"))
    msgs = [m for b in sub.batches for m in b]
    edge, _ = read_ahead_loop(journal, sub)
    if not read_ahead:
        edge.consumer = type(edge.consumer)(**{**edge.consumer.__dict__, "read_ahead": False})
    task = await run_until(edge, lambda: all(m.settled for m in msgs))
    await stop(task)
    handled = [(what, items) for what, items in journal if what != "read"]
    assert handled == [("start", ["a1", "b1"]), ("end", ["a1", "b1"]), ("start", ["a2", "b2"]),
                       ("end", ["a2", "b2"]), ("start", ["a3"]), ("end", ["a3"])]  # one at a time, in order
    first_end = journal.index(("end", ["a1", "b1"]))
    read_during_first = {what for what, _ in journal[journal.index(("start", ["a1", "b1"])):first_end]}
    # With read_ahead the second batch was read while the first was in its handler; without, only after.
    assert ("read" in read_during_first) is read_ahead
    assert journal.index(("read", "a2")) < first_end if read_ahead else journal.index(("read", "a2")) > first_end
    assert [m.outcome for m in msgs] == ["ack"] * 5 and sub.unsubscribed


async def test_a_message_is_acknowledged_only_after_its_own_batch_was_handled():
    journal: list[tuple[str, object]] = []
    first, second = batches("a,b", "c")
    acked_when: dict[str, int] = {}
    for m in first + second:
        original = m.ack

        async def ack(m=m, original=original):
            acked_when[m.data.decode()] = len(journal)
            await original()

        m.ack = ack
    edge, _ = read_ahead_loop(journal, ScriptedSub(first, second))
    task = await run_until(edge, lambda: all(m.settled for m in first + second))
    await stop(task)
    for name, batch in (("a", ["a", "b"]), ("b", ["a", "b"]), ("c", ["c"])):
        assert acked_when[name] > journal.index(("end", batch))  # read ahead, but never acked before its commit


async def test_a_poison_message_is_isolated_and_dead_lettered_alone_the_others_handled():
    journal: list[tuple[str, object]] = []
    first, second = batches("a,poison,b", "c,d")

    def fail(items: list[str]) -> None:
        if "poison" in items:
            raise PermanentError("cannot be stored")

    edge, reporter = read_ahead_loop(journal, ScriptedSub(first, second), fail=fail)
    task = await run_until(edge, lambda: all(m.settled for m in first + second))
    await stop(task)
    assert [m.outcome for m in first + second] == ["ack", "ack", "ack", "ack", "ack"]  # poison: acked once buried
    assert [letter.payload for letter in reporter.buried] == [b"poison"]
    assert edge.counters.isolated_batches == 1 and edge.counters.handled == 4
    handled = [items for what, items in journal if what == "end"]
    assert handled == [["a"], ["b"], ["c", "d"]]  # the second batch only after the first's isolation


async def test_while_the_database_is_away_the_batch_read_ahead_is_kept_too():
    outage = [2]
    journal: list[tuple[str, object]] = []
    first, second = batches("a", "b")

    def fail(items: list[str]) -> None:
        if items == ["a"] and outage[0]:
            outage[0] -= 1
            raise ConnectionRefusedError("connection refused")

    edge, reporter = read_ahead_loop(journal, ScriptedSub(first, second), handle_delay=0.01, fail=fail,
                                     backoff=(0.01,))
    task = await run_until(edge, lambda: all(m.settled for m in first + second))
    await stop(task)
    assert [m.extended for m in first] == [2] and [m.extended for m in second] == [2]
    assert [m.outcome for m in first + second] == ["ack", "ack"] and not reporter.buried


async def test_at_shutdown_the_batch_read_ahead_is_handed_back_and_the_one_in_its_handler_is_not_acked():
    journal: list[tuple[str, object]] = []
    first, second = batches("a,b", "c,d")
    edge, _ = read_ahead_loop(journal, ScriptedSub(first, second), handle_delay=3600)
    task = await run_until(edge, lambda: ("read", "d") in journal)
    await eventually(lambda: ("start", ["a", "b"]) in journal, every=POLL)
    await stop(task)
    assert [m.settled for m in first] == [[], []]  # its handler never returned: redelivered after the ack wait
    assert [m.outcome for m in second] == ["nak", "nak"]  # back to the stream now, for another replica


@pytest.mark.parametrize("read_ahead", [True, False])
async def test_a_batch_whose_reading_fails_does_not_end_the_consumer(read_ahead):
    journal: list[tuple[str, object]] = []
    first, second = batches("malformed x,a", "b")
    edge, reporter = read_ahead_loop(journal, ScriptedSub(first, second))
    edge.consumer = type(edge.consumer)(**{**edge.consumer.__dict__, "read_ahead": read_ahead})

    async def refusing(subject: str, body: bytes, reason: str) -> None:
        raise ConnectionError("bus away")  # refusing the malformed message fails: reading the batch raises

    reporter.reject = refusing
    task = await run_until(edge, lambda: all(m.settled for m in second))
    await stop(task)
    assert [m.outcome for m in second] == ["ack"] and ("end", ["b"]) in journal
    assert [m.settled for m in first] == [[], []]  # unsettled: back after the ack wait, nothing lost
