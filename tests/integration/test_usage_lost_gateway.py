"""GPU-hours lost to interruptions through the real gateway (GET /v1/usage and its CSV) on real NATS and
PostgreSQL, over the stand-in public views of tests/integration/test_gateway.py: each interrupted run's charges
after its last checkpoint, per organisation; a run that ended by itself loses nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from tests.integration.test_gateway import HEALTH_BUDGET_DDL, gateway

pytestmark = pytest.mark.integration

T0 = datetime(2026, 11, 10, 9, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


async def _job(pool, job_id: str, org: str, state: str, attempts: dict, events: list[tuple], runs: list[tuple]):
    await pool.execute(
        "INSERT INTO queue.jobs_public (id, name, owner, state, spec, attempts, attempt_number, lease_epoch,"
        " created_at, org) VALUES ($1, $1, 'ann', $2, '{}'::jsonb, $3::jsonb, 1, 2, $4, $5)",
        job_id, state, json.dumps(attempts), at(0), org)
    await pool.executemany(
        "INSERT INTO queue.job_events_public (job_id, seq, event, state, reason, epoch, detail, time)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7::jsonb, $8)",
        [(job_id, seq, *event, at(seq)) for seq, event in enumerate(events, 1)])
    await pool.executemany(
        "INSERT INTO budget.usage_public (job_id, epoch, executor_id, seq, devices, wall_seconds, gpu_seconds,"
        " started_at, ended_at) VALUES ($1, $2, 'ex', $3, 2, $5, $4, $6, $7)",
        [(job_id, epoch, seq, gpu, float(end - start), at(start), at(end)) for seq, (epoch, start, end, gpu)
         in enumerate(runs, 1)])
    await pool.executemany("INSERT INTO budget.ledger_public VALUES ($1, $2, $3)",
                           [(job_id, gpu, at(end)) for _, _, end, gpu in runs])


def checkpoint(seconds: float) -> tuple:
    return ("checkpointed", "running", None, 1, json.dumps({"step": 50, "at": at(seconds).isoformat()}))


async def test_usage_reports_the_gpu_time_lost_since_each_interrupted_runs_checkpoint(env):
    async with gateway(env) as gw:
        pool = gw.rt.pool
        await pool.execute(HEALTH_BUDGET_DDL)
        leased = ("leased", "running", None, 1, "{}")
        # north: preempted after a checkpoint at 45 s; 30 of the 30..60 sample and the whole 60..90 one lost.
        await _job(pool, "pre", "north", "running", {"preempted": 1},
                   [("submitted", "queued", None, None, "{}"), leased, checkpoint(45),
                    ("requeued", "queued", "preempted", 1, "{}"), ("leased", "running", None, 2, "{}")],
                   [(1, 0, 30, 60.0), (1, 30, 60, 60.0), (1, 60, 90, 60.0), (2, 100, 130, 40.0)])
        # south: the lease was lost with no checkpoint (all 100 lost); another job succeeded (nothing lost).
        await _job(pool, "lost", "south", "queued", {"transport_lost": 1},
                   [("submitted", "queued", None, None, "{}"), leased,
                    ("abandoned", "running", "lease expired", 1, "{}"),
                    ("requeued", "queued", "transport_lost", 1, "{}")],
                   [(1, 0, 50, 100.0)])
        await _job(pool, "ok", "south", "succeeded", {},
                   [("submitted", "queued", None, None, "{}"), leased, ("succeeded", "succeeded", None, 1, "{}")],
                   [(1, 0, 40, 80.0)])

        resp = await gw.client.get("/v1/usage?period=2026-11", headers=gw.as_("auditor"))
        assert resp.status_code == 200, resp.text
        rows = {r["key"]: r for r in resp.json()["rows"]}
        assert rows["north"]["lost_gpu_seconds"] == 90.0 and rows["north"]["interruptions"] == 1
        assert rows["north"]["gpu_seconds"] == 220.0
        assert rows["south"]["lost_gpu_seconds"] == 100.0 and rows["south"]["gpu_seconds"] == 180.0

        by_user = (await gw.client.get("/v1/usage?period=2026-11&group_by=user&org=south",
                                       headers=gw.as_("auditor"))).json()
        assert [(r["key"], r["lost_gpu_seconds"]) for r in by_user["rows"]] == [("ann", 100.0)]
        csv = (await gw.client.get("/v1/usage?period=2026-11&format=csv", headers=gw.as_("auditor"))).text
        header, *lines = [line.split(",") for line in csv.strip().splitlines()]
        assert {line[0]: line[header.index("lost_gpu_seconds")] for line in lines} == {"north": "90.000",
                                                                                       "south": "100.000"}
        # Another period holds none of these charges: nothing lost there.
        december = (await gw.client.get("/v1/usage?period=2026-12", headers=gw.as_("auditor"))).json()
        assert all(r["lost_gpu_seconds"] == 0 for r in december["rows"])
