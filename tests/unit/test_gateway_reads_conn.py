"""The job the gateway answers with (a submit's 201, GET /v1/jobs/{id}) is read on one pooled connection (every
connection the pool lends is reset on its return, a round trip of its own) and in one statement while every view
exists; with a view missing (its owner has not migrated yet) in five, the missing one read as empty
(docs/performance.md, item 2). What the one statement returns is checked against the five queries on real
PostgreSQL in tests/integration/test_gateway_job_at_once.py."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from services.gateway.reads import Reads

pytestmark = pytest.mark.unit
NOW = datetime(2026, 12, 1, tzinfo=UTC)
JOB = {"id": "j1", "name": "n", "owner": "ann", "state": "queued", "lease_epoch": None, "created_at": NOW,
       "updated_at": NOW, "spec": '{"workload": {"kind": "command", "command": ["true"]}}', "attempts": "[]"}
EVENT = {"job_id": "j1", "seq": 1, "event": "submitted", "state": "queued", "time": NOW, "detail": "{}"}


class Conn:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        if "AS job" in sql:
            self.pool.queries.append("at once")
            if self.pool.missing:
                raise asyncpg.UndefinedTableError('relation "budget.jobs_public" does not exist')
            return ([{"job": dict(JOB), "signal": None, "budget": None, "usage": [], "events": [EVENT]}]
                    if args[0] == "j1" else [])
        self.pool.queries.append(sql.split(" FROM ")[1].split()[0].strip("()"))
        if "queue.jobs_public" in sql:
            return [dict(JOB)] if args[0] == "j1" else []
        if "job_events_public" in sql:
            return [EVENT]
        return []


class Pool:
    """Counts the connections lent; a query sent to the pool itself borrows one more."""

    def __init__(self, missing: bool = False) -> None:
        self.lent = 0
        self.missing = missing
        self.queries: list[str] = []

    @contextlib.asynccontextmanager
    async def acquire(self):
        self.lent += 1
        yield Conn(self)

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        self.lent += 1
        return await Conn(self).fetch(sql, *args)


async def test_one_job_is_one_statement_on_one_connection():
    pool = Pool()
    job = await Reads(pool).get_job("j1")
    assert job is not None and job["id"] == "j1" and [e["event"] for e in job["events"]] == ["submitted"]
    assert job["spec"]["workload"]["command"] == ["true"]  # jsonb columns parsed as in the five queries
    assert pool.lent == 1 and pool.queries == ["at once"]


async def test_an_unknown_job_is_none_after_one_statement():
    pool = Pool()
    assert await Reads(pool).get_job("nope") is None
    assert pool.lent == 1 and pool.queries == ["at once"]


async def test_with_a_view_missing_the_job_is_read_view_by_view_on_the_same_connection():
    pool = Pool(missing=True)
    reads = Reads(pool)
    job = await reads.get_job("j1")
    assert job is not None and job["id"] == "j1" and [e["event"] for e in job["events"]] == ["submitted"]
    assert pool.lent == 1
    assert pool.queries[0] == "at once" and pool.queries[1] == "queue.jobs_public" and len(pool.queries) == 6
    assert await reads.get_job("nope") is None and pool.queries[-2:] == ["at once", "queue.jobs_public"]
