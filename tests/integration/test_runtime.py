"""The shared runtime against real servers: migrations apply once, the outbox publishes in order exactly
once, and a malformed message is refused visibly instead of looping."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from libs.contracts.commands import SubmitJob
from libs.contracts.envelope import ContractError, RejectedMessage
from libs.runtime import db, outbox
from libs.runtime.service import Runtime
from tests.support.services import eventually

pytestmark = pytest.mark.integration


async def test_outbox_publishes_in_order_once_even_when_relayed_twice(env):
    rt = await Runtime.open("t", env.settings(), schema="tq", package=None)
    try:
        await db.migrate(rt.pool, "tq", "libs.runtime")  # the outbox table comes with every schema
        msgs = [SubmitJob(actor="a", spec={"workload": {"kind": "finetune"}}) for _ in range(5)]
        async with rt.pool.acquire() as conn, conn.transaction():
            await outbox.add(conn, "tq", [(rt.subjects.cmd("submit"), m) for m in msgs])
        relay = outbox.OutboxRelay(rt.pool, "tq", rt.js)
        assert await relay.relay_once() == 5
        # A crash after publishing but before marking: the rows are published again with the same ids.
        await rt.pool.execute('UPDATE "tq".outbox SET published_at = NULL')
        assert await relay.relay_once() == 5
        sub = await rt.js.pull_subscribe(rt.subjects.cmd("submit"), durable=None)
        got = await sub.fetch(10, timeout=2)
        assert [SubmitJob.decode(m.data).id for m in got] == [m.id for m in msgs]
    finally:
        await rt.close()


async def test_malformed_message_is_refused_and_published_for_operators(env):
    rt = await Runtime.open("t", env.settings(), schema=None, package=None)
    try:
        sub = await rt.js.pull_subscribe(rt.subjects.rejected("t"), durable=None)
        body = b'{"schema": "teto.cmd.submit/1", "actor": 7, "spec": "\x00"}'
        with pytest.raises(ContractError) as refused:
            SubmitJob.decode(body)
        await rt.reject("x.cmd", body, refused.value.reason)
        (msg,) = await sub.fetch(1, timeout=2)
        note = RejectedMessage.decode(msg.data)
        assert note.subject == "x.cmd" and "control character" in note.reason
        assert "\x00" not in note.payload_excerpt  # what a person reads is always storable
        assert rt.rejected == 1
    finally:
        await rt.close()


async def test_singleton_body_stops_with_the_loop_and_another_replica_takes_over(env):
    from libs.runtime.singleton import SingletonLoop

    ticks = {"a": 0, "b": 0}

    def body(name):
        async def run():
            while True:
                ticks[name] += 1
                await asyncio.sleep(0.05)
        return run

    a = asyncio.create_task(SingletonLoop(env.database_url, "x", body("a"), retry_seconds=0.2).run())
    await asyncio.sleep(0.5)
    b = asyncio.create_task(SingletonLoop(env.database_url, "x", body("b"), retry_seconds=0.2).run())
    await asyncio.sleep(0.5)
    assert ticks["a"] > 0 and ticks["b"] == 0  # one leader at a time
    a.cancel()
    await asyncio.gather(a, return_exceptions=True)
    frozen = ticks["a"]
    await asyncio.sleep(1.0)
    assert ticks["a"] == frozen  # the body stopped with its loop
    assert ticks["b"] > 0  # the other replica took over
    b.cancel()
    await asyncio.gather(b, return_exceptions=True)


async def test_a_unit_writes_its_events_with_its_change_counts_stale_facts_and_kicks_the_relay_only_on_commit(env):
    from libs.runtime.fencing import StaleCounter, StaleEpoch
    from libs.runtime.unit import Units

    rt = await Runtime.open("t", env.settings(), schema="tu", package=None)
    kicks: list[int] = []
    try:
        await db.migrate(rt.pool, "tu", "libs.runtime")
        units = Units(rt.pool, "tu", rt.subjects, StaleCounter("t"), kick=lambda: kicks.append(1))
        msg = SubmitJob(actor="a", spec={"workload": {"kind": "finetune"}})
        with pytest.raises(RuntimeError):
            async with units.begin() as unit:
                unit.emit((rt.subjects.cmd("submit"), msg))
                unit.stale(StaleEpoch("ex1", "j1", 1, 2))
                raise RuntimeError("rolled back")
        assert await rt.pool.fetchval('SELECT count(*) FROM "tu".outbox') == 0
        assert units.counter.count == 0 and kicks == []
        async with units.begin() as unit:
            unit.emit((rt.subjects.cmd("submit"), msg))
            unit.stale(StaleEpoch("ex1", "j1", 1, 2))
        assert await rt.pool.fetchval('SELECT msg_id FROM "tu".outbox') == msg.id
        assert units.counter.count == 1 and units.counter.by_executor == {"ex1": 1} and kicks == [1]
    finally:
        await rt.close()


async def test_a_pool_with_a_connection_never_given_back_still_closes_within_its_bound(env):
    """asyncpg's ``Pool.close`` waits for ever on a borrowed connection that is never released: a service (or a
    test's gateway) whose shutdown never ends. ``close_pool`` waits its bound, then terminates the pool."""
    pool = await db.create_pool(env.settings().database_url, max_size=2)
    held = await pool.acquire()  # as a handler cancelled mid-query that never got to release it
    backend = held.get_server_pid()
    assert await asyncio.wait_for(db.close_pool(pool, timeout=0.5), 10) is False
    watcher = await asyncpg.connect(env.settings().database_url)
    try:  # terminated: its server process ends too
        await eventually(lambda: watcher.fetchval("SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $1", backend),
                         10, "the held connection's backend to end")
    finally:
        await watcher.close()

    pool = await db.create_pool(env.settings().database_url, max_size=2)
    async with pool.acquire() as conn:
        await conn.execute("SELECT 1")
    assert await asyncio.wait_for(db.close_pool(pool, timeout=5), 10) is True  # all given back: a graceful close
