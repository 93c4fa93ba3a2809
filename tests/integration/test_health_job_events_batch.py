"""Health applies a batch of job events in one upsert per round (services/health/store.py ``apply_job_events``,
``rounds``: as many as the most events of one job) and leaves every job row exactly as one upsert per event, in
(job, sequence) order, did. Random batches with redeliveries,
new and old epochs and executorless events, against real PostgreSQL, from rows heartbeats left."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from libs.contracts.jobs import JobEvent, JobState
from services.health import store
from services.health.settings import HealthSettings
from tests.integration.helpers_sql import migrated, statements

pytestmark = pytest.mark.integration

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
STATES = [JobState.QUEUED, JobState.RUNNING, JobState.RUNNING, JobState.INTERRUPTED, JobState.SUCCEEDED]


def random_events(rng: random.Random, n: int) -> list[JobEvent]:
    return [JobEvent(job_id=f"j{rng.randrange(5)}", seq=rng.randrange(1, 9), event="started", state=rng.choice(STATES),
                     epoch=rng.choice([None, 1, 2, 3]), executor_id=rng.choice([None, "ex1", "ex2"]),
                     time=T0 + timedelta(seconds=rng.randrange(100))) for _ in range(n)]


async def rows(conn: asyncpg.Connection) -> list[tuple]:
    return [tuple(r) for r in await conn.fetch(
        "SELECT job_id, state, event_seq, epoch, executor_id, last_contact_at, phase, step, step_changed_at,"
        " progress_interval_seconds FROM health.jobs ORDER BY 1")]


async def test_a_batch_of_job_events_leaves_every_job_as_one_by_one_did(env):
    rng = random.Random(12)
    async with migrated(env, HealthSettings, store.SCHEMA, "services.health") as (_, conn):
        # A job only heartbeats told health about (event_seq 0), one with a contact, phase and step.
        await conn.execute("INSERT INTO health.jobs (job_id, epoch, executor_id, last_contact_at, phase, step,"
                           " step_changed_at, progress_interval_seconds) VALUES"
                           " ('j0', 1, 'ex1', $1, 'training', 7, $1, 30), ('j1', 0, 'ex2', $1, 'idle', NULL, $1, 30)",
                           T0)
        for round_ in range(40):
            batch = random_events(rng, rng.choice([1, 4, 20]))
            tx = conn.transaction()
            await tx.start()
            for ev in sorted(batch, key=lambda e: (e.job_id, e.seq)):
                await store.apply_job_events(conn, [ev])
            expected = await rows(conn)
            await tx.rollback()
            with statements(conn, "health.") as sent:
                async with conn.transaction():
                    await store.apply_job_events(conn, batch)
            assert await rows(conn) == expected, (round_, batch)
            assert len(sent) == max(Counter(e.job_id for e in batch).values()), sent
