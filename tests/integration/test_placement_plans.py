"""The plans of the statements every placement wake and pass runs, on a fleet laid out as production lays it out
(finished jobs first in the table, hundreds of executors, running jobs holding some): what PostgreSQL does for
each must not grow with the product of two tables, nor read the table where an index answers.

Checked on the generic plan too (``plan_cache_mode = force_generic_plan``): asyncpg prepares every statement, and
after a few executions PostgreSQL may run the plan it made without the parameters' values, where it estimates
``LIMIT $4`` at a few rows and chose a nested loop comparing every free executor with every running job's
workers (23 ms at 1,000 free executors and 200 running jobs; 1.4 ms as one hashed set)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from bench import _placement_data as data
from libs.contracts.nodes import RULED_OUT_STATES
from libs.runtime.service import Runtime
from services.queue import scans, tenancy_edge
from services.queue.settings import QueueSettings
from services.queue.store import SCHEMA

pytestmark = pytest.mark.integration

RULED_OUT = sorted(s.value for s in RULED_OUT_STATES)


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


async def explained(conn, sql: str, *args: Any, generic: bool) -> list[dict[str, Any]]:  # noqa: ANN001
    """Every node of the plan PostgreSQL runs ``sql`` with (executed: EXPLAIN ANALYZE), the generic one or not."""
    await conn.execute(f"SET plan_cache_mode = {'force_generic_plan' if generic else 'force_custom_plan'}")
    try:
        stmt = await conn.prepare("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
        (root,) = json.loads(await stmt.fetchval(*args))
        return list(nodes(root["Plan"]))
    finally:
        await conn.execute("RESET plan_cache_mode")


def quadratic(plan: list[dict[str, Any]]) -> list[str]:
    """Joins that compare each row of one side with each of the other (a nested loop filtering on a join)."""
    return [f"{n['Node Type']}: {n.get('Join Filter')}" for n in plan
            if n["Node Type"] == "Nested Loop" and "Join Filter" in n]


def table_scans(plan: list[dict[str, Any]], table: str) -> list[str]:
    return [n["Node Type"] for n in plan if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == table]


def jobs_read_per_row(plan: list[dict[str, Any]]) -> list[str]:
    """Reads of the jobs table run again for each row of something else (a subplan not hashed, say)."""
    return [f"{n['Node Type']} x{n['Actual Loops']}" for n in plan
            if n.get("Relation Name") == "jobs" and n["Actual Loops"] > 1]


@pytest.fixture
async def fleet(env):  # noqa: ANN001, ANN201
    """3,000 queued jobs of 6 organisations behind 6,000 finished ones (a third of the rows queued, but none
    among the first: the planner expects to meet one at once in the table), 150 executors, 30 of them busy."""
    settings = env.settings(QueueSettings)
    rt = await Runtime.open("queue", settings, schema=SCHEMA, package="services.queue")
    try:
        async with rt.pool.acquire() as conn:
            now = await conn.fetchval("SELECT clock_timestamp()")
            await data.seed(conn, now - timedelta(seconds=1),
                            data.Sizes(queued=3_000, free=120, busy=30, finished=6_000, orgs=6))
            for table in ("jobs", "executors", "nodes"):
                await conn.execute(f"VACUUM ANALYZE queue.{table}")
        yield rt
    finally:
        await rt.close()


async def test_a_wakes_question_reads_the_queued_index_and_the_held_executors_once(fleet):
    async with fleet.pool.acquire() as conn:
        for most in (1, 200):
            queued, free = await scans.queued_and_free(conn, 600.0, most=most)
            assert queued and free == min(most, 120)
            for generic in (False, True):
                plan = await explained(conn, scans.QUEUED_AND_FREE, 600.0, False, RULED_OUT, most, generic=generic)
                assert quadratic(plan) == [], (most, generic)
                assert jobs_read_per_row(plan) == [], (most, generic)
                # "any queued" is the first entry of the queued jobs' index, not a walk through finished jobs
                assert table_scans(plan, "jobs") == [], (most, generic)


async def test_the_fleets_executors_are_matched_with_the_held_ones_once(fleet):
    async with fleet.pool.acquire() as conn:
        now = await conn.fetchval("SELECT clock_timestamp()")
        listed = await tenancy_edge.schedulable_nodes(conn, now, 600.0)
        assert (len(listed), sum(n.free for n in listed)) == (150, 120)
        for generic in (False, True):
            plan = await explained(conn, tenancy_edge.SCHEDULABLE_NODES, now - timedelta(seconds=600), False,
                                   RULED_OUT, generic=generic)
            assert quadratic(plan) == [], generic
            assert jobs_read_per_row(plan) == [], generic


async def test_candidates_are_read_from_the_index_alone(fleet):
    """Each organisation's first queued jobs, with what each asks for, come from ``jobs_queued_org`` without
    visiting the table (``asked_devices`` is in the index): no heap fetch on a vacuumed table."""
    async with fleet.pool.acquire() as conn:
        orgs = await tenancy_edge.organisations(conn)
        assert len(await tenancy_edge.candidates(conn, orgs, 200)) == 200
        for generic in (False, True):
            plan = await explained(conn, tenancy_edge.CANDIDATES, 200, list(orgs),
                                   [o.weight for o in orgs.values()], generic=generic)
            reads = [n for n in plan if n.get("Index Name") == "jobs_queued_org"]
            assert reads and all(n["Node Type"] == "Index Only Scan" and n["Heap Fetches"] == 0 for n in reads)
            assert table_scans(plan, "jobs") == [], generic


async def test_asked_devices_are_the_workers_times_their_gpus_and_at_least_one(fleet):
    async with fleet.pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT asked_devices, (spec->>'workers')::int AS w, (spec->>'gpus_per_worker')::int AS g"
            " FROM queue.jobs")
        assert len({(r["w"], r["g"]) for r in rows}) > 1  # the data set has several shapes
        assert all(r["asked_devices"] == max(1, (r["w"] or 1) * max(1, r["g"] or 0)) for r in rows)
        # Kept by the database as the spec changes; nobody writes it.
        job = await conn.fetchval("SELECT id FROM queue.jobs WHERE state = 'queued' LIMIT 1")
        for shape, devices in (('{"workers": 3, "gpus_per_worker": 2}', 6), ('{"workers": 3, "gpus_per_worker": 0}', 3),
                               ('{"workers": 1, "gpus_per_worker": 0}', 1)):
            await conn.execute("UPDATE queue.jobs SET spec = spec || $2::jsonb WHERE id = $1", job, shape)
            assert await conn.fetchval("SELECT asked_devices FROM queue.jobs WHERE id = $1", job) == devices
