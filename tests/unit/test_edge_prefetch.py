"""The edge fetches one batch ahead (libs/runtime/edge_loop.py, ``ConsumerLoop.run``): the next batch is on its way
while the current one is handled, yet batches are handled one at a time in the order they were fetched (per
executor and per job order holds), a held batch keeps the batch fetched behind it too, and at shutdown a batch
fetched but never handled is handed back at once instead of waiting out its ack wait."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.edgefakes import loop
from tests.support.edgescript import ScriptedSub, batches, run_until, stop

pytestmark = pytest.mark.unit


async def test_the_next_batch_is_fetched_while_the_current_one_is_handled_and_batches_never_overlap():
    journal: list[tuple[str, list[str], int]] = []
    sub = ScriptedSub(*batches("a1,b1", "a2,b2", "a3"))

    async def handle(items: list[str]) -> None:
        journal.append(("start", items, sub.fetches))
        await asyncio.sleep(0.02)  # the handler's database round trip
        journal.append(("end", items, sub.fetches))

    edge, _ = loop(handle)
    edge._sub = sub
    msgs = [m for b in sub.batches for m in b]
    task = await run_until(edge, lambda: all(m.settled for m in msgs))
    await stop(task)
    # Handled strictly one batch after the other, in fetch order (a1 before a2 before a3: one executor's order).
    assert [(what, items) for what, items, _ in journal] == [
        ("start", ["a1", "b1"]), ("end", ["a1", "b1"]), ("start", ["a2", "b2"]), ("end", ["a2", "b2"]),
        ("start", ["a3"]), ("end", ["a3"])]
    # While the first batch was handled, the second had already been fetched (without prefetch: 1 fetch).
    assert journal[1][2] >= 2
    assert [m.outcome for m in msgs] == ["ack"] * 5 and sub.unsubscribed


async def test_while_the_database_is_away_the_batch_fetched_ahead_is_kept_too():
    outage = [2]
    first, second = batches("a", "b")

    async def handle(items: list[str]) -> None:
        await asyncio.sleep(0.01)
        if items == ["a"] and outage[0]:
            outage[0] -= 1
            raise ConnectionRefusedError("connection refused")

    edge, reporter = loop(handle, backoff=(0.01,))
    edge._sub = ScriptedSub(first, second)
    task = await run_until(edge, lambda: all(m.settled for m in first + second))
    await stop(task)
    # Both the held batch and the one behind it had their ack deadlines extended on each try: neither is
    # redelivered elsewhere during an outage, and neither spends a delivery.
    assert [m.extended for m in first] == [2] and [m.extended for m in second] == [2]
    assert [m.outcome for m in first + second] == ["ack", "ack"] and not reporter.buried


async def test_at_shutdown_a_batch_fetched_but_not_handled_is_handed_back_at_once():
    first, second = batches("a,b", "c,d")
    started = asyncio.Event()

    async def handle(items: list[str]) -> None:
        started.set()
        await asyncio.Event().wait()  # still handling the first batch when the service stops

    edge, _ = loop(handle)
    sub = ScriptedSub(first, second)
    edge._sub = sub
    task = await run_until(edge, lambda: started.is_set() and sub.fetches >= 2)
    await asyncio.sleep(0.01)  # the second batch has arrived
    await stop(task)
    assert [m.outcome for m in second] == ["nak", "nak"]  # back to the stream now, for another replica
    assert all(not m.settled for m in first)  # maybe applied: never nak'd, it returns after its ack wait
    assert sub.unsubscribed


async def test_a_failed_fetch_is_retried_and_the_batches_behind_it_handled():
    (only,) = batches("a")
    handled: list[list[str]] = []

    async def handle(items: list[str]) -> None:
        handled.append(items)

    edge, _ = loop(handle)
    edge.retry_seconds = 0.01
    edge._sub = ScriptedSub(only, fail_first=ConnectionResetError("server restarting"))
    task = await run_until(edge, lambda: bool(only[0].settled))
    await stop(task)
    assert handled == [["a"]] and only[0].outcome == "ack"
