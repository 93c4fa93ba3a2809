"""The outbox takes a batch of rows in one statement (``outbox.add_rows``: arrays, not a row each): the rows keep
their order (the relay publishes by id), a message id already queued is skipped, and so is a repeat inside the
batch."""

from __future__ import annotations

import pytest

from libs.contracts.commands import SubmitJob
from libs.runtime import db, outbox
from libs.runtime.service import Runtime

pytestmark = pytest.mark.integration


async def test_a_batch_keeps_its_order_in_one_statement_and_skips_ids_already_queued(env):
    rt = await Runtime.open("t", env.settings(), schema="tb", package=None)
    try:
        await db.migrate(rt.pool, "tb", "libs.runtime")
        msgs = [SubmitJob(actor="a", spec={"workload": {"kind": "finetune"}}) for _ in range(40)]
        subject = rt.subjects.cmd("submit")
        rows = outbox.rows_of([(subject, m) for m in msgs])
        async with rt.pool.acquire() as conn, conn.transaction():
            assert await outbox.add_rows(conn, "tb", rows[:3]) == 3
            # Ids 0-2 again (already queued), then a repeat of id 10 inside the batch: each stored once.
            await outbox.add_rows(conn, "tb", [*rows, rows[10]])
        stored = await rt.pool.fetch('SELECT msg_id, subject, payload, headers FROM "tb".outbox ORDER BY id')
        assert [r["msg_id"] for r in stored] == [m.id for m in msgs]
        assert all(r["subject"] == subject for r in stored)
        assert [SubmitJob.decode(r["payload"]) for r in stored] == msgs
        assert {r["headers"] for r in stored} == {"{}"}
    finally:
        await rt.close()
