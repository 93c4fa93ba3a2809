"""The job the gateway answers with (a submit's 201, GET /v1/jobs/{id}) is read on one pooled connection: every
connection the pool lends is reset on its return, a round trip of its own (docs/performance.md, item 2)."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any

import pytest

from services.gateway.reads import Reads

pytestmark = pytest.mark.unit
NOW = datetime(2026, 12, 1, tzinfo=UTC)
JOB = {"id": "j1", "name": "n", "owner": "ann", "state": "queued", "lease_epoch": None, "created_at": NOW,
       "updated_at": NOW, "spec": '{"workload": {"kind": "command", "command": ["true"]}}', "attempts": "[]"}


class Conn:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        self.pool.queries.append(sql.split(" FROM ")[1].split()[0].strip("()"))
        if "queue.jobs_public" in sql:
            return [dict(JOB)] if args[0] == "j1" else []
        if "job_events_public" in sql:
            return [{"job_id": "j1", "seq": 1, "event": "submitted", "state": "queued", "time": NOW,
                     "detail": "{}"}]
        return []


class Pool:
    """Counts the connections lent; a query sent to the pool itself borrows one more."""

    def __init__(self) -> None:
        self.lent = 0
        self.queries: list[str] = []

    @contextlib.asynccontextmanager
    async def acquire(self):
        self.lent += 1
        yield Conn(self)

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        self.lent += 1
        return await Conn(self).fetch(sql, *args)


async def test_one_job_is_read_on_one_connection():
    pool = Pool()
    job = await Reads(pool).get_job("j1")
    assert job is not None and job["id"] == "j1" and [e["event"] for e in job["events"]] == ["submitted"]
    assert pool.lent == 1
    assert pool.queries[0] == "queue.jobs_public" and len(pool.queries) == 5  # job, usage, signal, budget, events


async def test_an_unknown_job_is_none_after_one_query():
    pool = Pool()
    assert await Reads(pool).get_job("nope") is None
    assert pool.lent == 1 and pool.queries == ["queue.jobs_public"]
