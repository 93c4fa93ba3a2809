"""The usage report against real PostgreSQL (the budget's and the queue's migrations and public views): its total
equals the budget ledger's sum for the period to the second, and its rows add up to that total, per organisation,
project and user; an organisation's report holds only its own jobs."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import asyncpg
import pytest

from libs.runtime import db
from services.gateway.domain.usage import GroupBy, period_window
from services.gateway.reads import Reads
from services.gateway.routes.tenancy import usage_report as _report

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 30, 23, 0, tzinfo=UTC)


async def test_usage_totals_equal_the_ledger_to_the_second(env):
    pool = await asyncpg.create_pool(env.database_url, min_size=1, max_size=2)
    try:
        await db.migrate(pool, "budget", "services.budget")
        await db.migrate(pool, "queue", "services.queue")
        rng = random.Random(14)
        orgs = {"north": ["rad", "gen"], "south": ["default"]}
        jobs = []
        for i in range(40):
            org = rng.choice(sorted(orgs))
            jobs.append((f"j{i}", org, rng.choice(orgs[org]), f"user{i % 5}", rng.choice(["succeeded", "running"])))
        async with pool.acquire() as conn:
            await conn.executemany(
                "INSERT INTO queue.jobs (id, name, owner, state, spec, attempts, created_at, updated_at, org, project)"
                " VALUES ($1, $1, $4, $5, $6::jsonb, $7::jsonb, $8, $8, $2, $3)",
                [(j, org, project, user, state, json.dumps({"checkpoint_every_steps": 50}),
                  json.dumps({"preempted": 1}), T0) for j, org, project, user, state in jobs])
            rows = []
            for k in range(600):  # stretches around the month boundary: some are November's
                job = rng.choice(jobs)[0]
                ended = T0 + timedelta(seconds=rng.uniform(-7200, 7200))
                rows.append((job, 1, "ex", k + 1, 1, rng.uniform(0, 900), rng.uniform(0, 900) * rng.choice([1, 8]),
                             ended))
            await conn.executemany(
                "INSERT INTO budget.ledger (job_id, epoch, executor_id, seq, devices, wall_seconds, gpu_seconds,"
                " ended_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)", rows)
        request = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(reads=Reads(pool))))
        start, end = period_window("2026-12", T0 + timedelta(days=1))
        ledger = await pool.fetchval("SELECT sum(gpu_seconds) FROM budget.ledger WHERE ended_at >= $1"
                                     " AND ended_at < $2", start, end)
        for group_by in GroupBy:
            report = await _report(request, None, start, end, group_by, owner=None)
            assert round(report.total_gpu_seconds) == round(ledger)
            assert abs(report.total_gpu_seconds - ledger) < 1e-6
            assert abs(sum(r.gpu_seconds for r in report.rows) + report.unattributed_gpu_seconds - ledger) < 1e-6
            assert report.unattributed_gpu_seconds == 0
        north = await _report(request, "north", start, end, GroupBy.PROJECT, owner=None)
        north_ledger = await pool.fetchval(
            "SELECT sum(l.gpu_seconds) FROM budget.ledger l JOIN queue.jobs j ON j.id = l.job_id"
            " WHERE j.org = 'north' AND l.ended_at >= $1 AND l.ended_at < $2", start, end)
        assert abs(north.total_gpu_seconds - north_ledger) < 1e-6
        assert {r.key.split("/")[0] for r in north.rows} == {"north"}
        assert sum(r.interruptions for r in north.rows) == sum(1 for j in jobs if j[1] == "north")
    finally:
        await pool.close()
