"""Health applies a batch of job events in one upsert per round (services/health/store ``apply_job_events``,
``rounds``: as many as the most events of one job) and leaves every job row exactly as one upsert per event, in
(job, sequence) order, did. Random batches with redeliveries,
new and old epochs and executorless events, against real PostgreSQL, from rows heartbeats left."""

from __future__ import annotations

import asyncio
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


def _sent_all(conn: asyncpg.Connection) -> tuple[list[str], object]:
    sent: list[str] = []

    def note(query) -> None:  # the transaction's own statements and ours (not asyncpg's type introspection)
        word = query.query.strip().split()[0].upper()
        if "health." in query.query or word.rstrip(";") in ("BEGIN", "COMMIT", "ROLLBACK"):
            sent.append(word)

    conn.add_query_logger(note)
    return sent, note


async def test_one_round_is_one_statement_and_more_are_one_transaction(env):
    """A batch of one round (each job once) is a single upsert, sent without BEGIN and COMMIT; a batch of two
    rounds is one transaction: when its second round fails, its first is not kept."""
    async with migrated(env, HealthSettings, store.SCHEMA, "services.health") as (_, conn):
        def event(job: str, seq: int) -> JobEvent:
            return JobEvent(job_id=job, seq=seq, event="started", state=JobState.RUNNING, epoch=1,
                            executor_id="ex1", time=T0)

        sent, note = _sent_all(conn)
        await store.apply_job_events(conn, [event("a", 1), event("b", 1)])
        await asyncio.sleep(0.01)  # query loggers are called soon after, not during
        assert sent == ["INSERT"], sent
        sent.clear()
        await store.apply_job_events(conn, [event("a", 2), event("a", 3)])
        await asyncio.sleep(0.01)
        assert sent == ["BEGIN;", "INSERT", "INSERT", "COMMIT;"], sent
        conn.remove_query_logger(note)
        assert dict((r["job_id"], r["event_seq"]) for r in await conn.fetch(
            "SELECT job_id, event_seq FROM health.jobs")) == {"a": 3, "b": 1}
        with pytest.raises(asyncpg.DataError):  # the second round's sequence does not fit the column
            await store.apply_job_events(conn, [event("b", 2), event("b", 3).model_copy(update={"seq": 2 ** 31})])
        assert await conn.fetchval("SELECT event_seq FROM health.jobs WHERE job_id = 'b'") == 1
