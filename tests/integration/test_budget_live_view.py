"""The budget service's public facts for live figures (migration 003): when the current run started, its last
usage sample, whether its records are closed, and its usage records, against the real service."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import pytest

from libs.contracts.usage import UsageRecord
from libs.runtime.bus import publish
from services.budget.app import serve
from services.budget.settings import BudgetSettings
from tests.integration.helpers_hba import jetstream
from tests.integration.test_usage_ledger import T0, leased, record, report, submitted
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration


async def test_the_view_tells_when_the_run_started_its_last_sample_and_when_its_records_closed(env):
    settings = env.settings(BudgetSettings)
    s = settings.subjects
    pg = await asyncpg.connect(env.database_url)
    try:
        async with running(serve, settings), jetstream(settings.nats_url) as (nc, js):
            await submitted(js, s, "j1")

            async def row(check):
                r = await pg.fetchrow("SELECT * FROM budget.jobs_public WHERE job_id = 'j1'")
                return r if r is not None and check(r) else None

            queued = await eventually(lambda: row(lambda r: r["ceiling_seconds"] is not None))
            assert queued["running_since"] is None and queued["last_sample_at"] is None and queued["devices"] == 1

            await leased(js, s, "j1", 2, epoch=1, executor="ex1")
            started = await eventually(lambda: row(lambda r: r["running_since"] is not None))
            assert started["epoch"] == 1 and started["last_sample_at"] is None and not started["run_closed"]
            assert abs((started["read_at"] - started["running_since"]).total_seconds()) < 60

            await publish(js, s.usage("ex1"), report("ex1", record("j1", 1), record("j1", 2)))
            sampled = await eventually(lambda: row(lambda r: r["last_sample_at"] is not None))
            assert sampled["last_sample_at"] >= started["running_since"] and not sampled["run_closed"]

            last = UsageRecord(job_id="j1", epoch=1, seq=3, devices=1, wall_seconds=0.5, last=True,
                               started_at=T0 + timedelta(seconds=3), ended_at=T0 + timedelta(seconds=3.5))
            await publish(js, s.usage("ex1"), report("ex1", last))
            await eventually(lambda: row(lambda r: r["run_closed"]))
            usage = await pg.fetch("SELECT seq, gpu_seconds, started_at, last FROM budget.usage_public"
                                   " WHERE job_id = 'j1' AND epoch = 1 ORDER BY seq")
            assert [(u["seq"], u["gpu_seconds"], u["last"]) for u in usage] == [(1, 1.0, False), (2, 1.0, False),
                                                                                 (3, 0.5, True)]
            # A second run (epoch 2) starts afresh: the first run's closed records do not close it.
            await leased(js, s, "j1", 3, epoch=2, executor="ex2")
            again = await eventually(lambda: row(lambda r: r["epoch"] == 2))
            assert not again["run_closed"] and again["last_sample_at"] is None
            assert again["running_since"] > started["running_since"]
    finally:
        await pg.close()
