"""The outbox relay publishes a batch with the acknowledgements awaited together, against real NATS and
PostgreSQL: every row once, each job's rows in order; a publish failing in the middle of a batch leaves its row
and every later row about the same thing unpublished, marks what was acknowledged, and the retry publishes the
rest once, in order (JetStream drops what it already stored by the message id)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from nats.js.api import StreamConfig
from nats.js.errors import NoStreamResponseError

from libs.contracts.commands import SubmitJob
from libs.runtime import db, outbox
from libs.runtime.jsacks import AckPipe
from libs.runtime.service import Runtime
from tests.support.services import eventually

pytestmark = pytest.mark.integration


def _msgs(n: int) -> list[SubmitJob]:
    return [SubmitJob(actor="a", spec={"workload": {"kind": "finetune"}}) for _ in range(n)]


async def _stream_order(rt: Runtime, subject: str, count: int) -> list[str]:
    sub = await rt.js.pull_subscribe(subject, durable=None)
    got = []
    while len(got) < count:
        got += await sub.fetch(count - len(got), timeout=5)
    return [m.headers["Nats-Msg-Id"] for m in got]


class _Recording(AckPipe):
    """The real pipe, recording when messages are sent and when acknowledgements are awaited."""

    def __init__(self, js) -> None:
        super().__init__(js)
        self.log: list[str] = []

    async def send(self, subject, payload, headers):
        self.log.append("send")
        return await super().send(subject, payload, headers)

    async def settle(self, futures, timeout):
        self.log.append(f"settle {len(futures)}")
        return await super().settle(futures, timeout)


async def _open(env) -> Runtime:
    rt = await Runtime.open("t", env.settings(), schema="tq", package=None)
    await db.migrate(rt.pool, "tq", "libs.runtime")
    return rt


async def test_a_batch_is_sent_before_its_acks_are_awaited_and_each_jobs_rows_keep_their_order(env):
    rt = await _open(env)
    try:
        s = rt.subjects
        # job a has three events, interleaved with other jobs' events: the waves cut before a's repeats
        plan = [("a", "queued"), ("b", "queued"), ("c", "queued"), ("a", "granted"), ("d", "queued"),
                ("a", "started"), ("b", "granted")]
        items = [(s.job_event(job, event), m) for (job, event), m in zip(plan, _msgs(len(plan)))]
        async with rt.pool.acquire() as conn, conn.transaction():
            await outbox.add(conn, "tq", items)
        relay = outbox.OutboxRelay(rt.pool, "tq", rt.js)
        relay._pipe = pipe = _Recording(rt.js)
        assert await relay.relay_once() == len(plan)
        # three waves: [a b c] [a d] [a b]; every message of a wave sent before its acks are awaited
        assert pipe.log == ["send"] * 3 + ["settle 3"] + ["send"] * 2 + ["settle 2"] + ["send"] * 2 + ["settle 2"]
        assert pipe.waiting == 0
        ids = [m.id for _, m in items]
        assert await _stream_order(rt, f"{s.prefix}.job.>", len(ids)) == ids  # all of them, in id order
        assert await rt.pool.fetchval('SELECT count(*) FROM "tq".outbox WHERE published_at IS NULL') == 0
    finally:
        await rt.close()


async def test_a_failure_in_the_middle_of_a_batch_publishes_the_rest_once_in_order_on_the_retry(env):
    rt = await _open(env)
    try:
        s = rt.subjects
        lost = f"{s.prefix}x.nostream.k"  # no stream takes it yet: JetStream has no responder for it
        msgs = _msgs(5)
        items = [(s.job_event("a", "queued"), msgs[0]),   # acked
                 (lost, msgs[1]),                          # fails in the middle of the first wave
                 (s.job_event("b", "queued"), msgs[2]),   # acked although sent after the failure's row
                 (lost, msgs[3]),                          # same key as the failed row: never sent this time
                 (s.job_event("a", "started"), msgs[4])]  # a later wave: not sent once the batch failed
        async with rt.pool.acquire() as conn, conn.transaction():
            await outbox.add(conn, "tq", items)
        relay = outbox.OutboxRelay(rt.pool, "tq", rt.js)
        relay._pipe = pipe = _Recording(rt.js)
        with pytest.raises(NoStreamResponseError):
            await relay.relay_once()
        assert pipe.log == ["send"] * 3 + ["settle 3"]
        published = await rt.pool.fetch('SELECT msg_id FROM "tq".outbox WHERE published_at IS NOT NULL ORDER BY id')
        assert [r["msg_id"] for r in published] == [msgs[0].id, msgs[2].id] and relay.published == 2
        # What the bus had stored though not marked (a crash before the mark) is sent again with the others.
        await rt.pool.execute('UPDATE "tq".outbox SET published_at = NULL WHERE msg_id = $1', msgs[2].id)
        # The bus recovers (here: a stream takes the subject); the retry starts at the first unpublished row.
        await rt.js.add_stream(StreamConfig(name=f"{s.prefix}X", subjects=[f"{s.prefix}x.>"]))
        assert await relay.relay_once() == 4
        assert await rt.pool.fetchval('SELECT count(*) FROM "tq".outbox WHERE published_at IS NULL') == 0
        # once each (the re-sent row deduplicated), each key in its order
        assert await _stream_order(rt, f"{s.prefix}.job.>", 3) == [msgs[0].id, msgs[2].id, msgs[4].id]
        assert await _stream_order(rt, f"{s.prefix}x.>", 2) == [msgs[1].id, msgs[3].id]
        info = await rt.js.stream_info(f"{s.prefix}X")
        assert info.state.messages == 2
        assert pipe.waiting == 0
    finally:
        await rt.close()


class _CountingPool:
    """The relay's pool, counting its reads and writes (the relay uses the pool's own fetch and execute)."""

    def __init__(self, pool) -> None:
        self._pool, self.fetches, self.executes = pool, 0, 0

    def __getattr__(self, name):
        return getattr(self._pool, name)

    async def fetch(self, *args, **kw):
        self.fetches += 1
        return await self._pool.fetch(*args, **kw)

    async def execute(self, *args, **kw):
        self.executes += 1
        return await self._pool.execute(*args, **kw)


async def test_the_running_relay_reads_once_a_kick_when_the_batch_was_not_full_and_misses_no_commit(env):
    rt = await _open(env)
    pool = _CountingPool(rt.pool)
    relay = outbox.OutboxRelay(pool, "tq", rt.js, batch=3)
    task = asyncio.create_task(relay.run(idle_wait=60.0))  # no poll in this test: only kicks wake it
    try:
        s = rt.subjects
        await eventually(lambda: pool.fetches == 1, timeout=30.0)  # its first look: nothing
        msgs = _msgs(7)

        async def commit(items) -> None:
            async with rt.pool.acquire() as conn, conn.transaction():
                await outbox.add(conn, "tq", items)
            relay.kick()

        await commit([(s.job_event(f"a{i}", "queued"), m) for i, m in enumerate(msgs[:2])])
        await eventually(lambda: relay.published == 2, timeout=30.0)
        await asyncio.sleep(0.2)
        assert pool.fetches == 2 and pool.executes == 1  # one read, one mark; no second read of nothing
        # a full batch is read again at once (there may be more), the rest waits for nothing
        await commit([(s.job_event(f"b{i}", "queued"), m) for i, m in enumerate(msgs[2:])])
        await eventually(lambda: relay.published == 7, timeout=30.0)
        await asyncio.sleep(0.2)
        assert pool.fetches == 4 and pool.executes == 3  # 3 rows (full), then 2 (not full)
        ids = [m.id for m in msgs]
        assert await _stream_order(rt, f"{s.prefix}.job.>", 7) == ids
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await rt.close()
