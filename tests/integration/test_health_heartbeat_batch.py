"""Health writes a batch of heartbeats in one upsert per table and round (services/health/store ``rounds``)
and leaves every executor and job row exactly as one upsert per heartbeat, in send order, did. Random batches
with flaps (checkpointing -> training), standing then moving steps, late and out-of-order heartbeats and stale
epochs, against real PostgreSQL, from the same starting rows each time."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from libs.contracts.telemetry import Heartbeat, Phase
from services.health import store
from services.health.settings import HealthSettings
from tests.integration.helpers_sql import migrated, statements

pytestmark = pytest.mark.integration

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=5)


async def one_by_one(conn: asyncpg.Connection, beats: list[Heartbeat]) -> None:
    """The handler with one heartbeat per statement, in send order (what the per-heartbeat upserts did)."""
    epochs = await store.job_epochs(conn, sorted({b.job_id for b in beats if b.job_id}))
    job_beats, _ = store.split_stale(beats, epochs)
    for b in sorted(job_beats, key=lambda b: b.sent_at):
        await store.record_heartbeats(conn, [], [b], NOW)
    for b in sorted(beats, key=lambda b: b.sent_at):
        await store.record_heartbeats(conn, [b], [], NOW)


async def batched(conn: asyncpg.Connection, beats: list[Heartbeat]) -> list[str]:
    """The handler as it is (services/health/handlers.py on_heartbeats); the statements it sent."""
    with statements(conn, "health.") as sent:
        epochs = await store.job_epochs(conn, sorted({b.job_id for b in beats if b.job_id}))
        job_beats, _ = store.split_stale(beats, epochs)
        await store.record_heartbeats(conn, beats, job_beats, NOW)
    return sent


async def rows(conn: asyncpg.Connection) -> tuple[list, list]:
    executors = await conn.fetch(
        "SELECT executor_id, node_id, group_name, gpus, accepting, phase, step, job_id, epoch, last_heartbeat,"
        " step_changed_at, heartbeat_interval_seconds, progress_interval_seconds, registered_at"
        " FROM health.executors ORDER BY 1")
    jobs = await conn.fetch("SELECT job_id, state, event_seq, epoch, executor_id, last_contact_at, phase, step,"
                            " step_changed_at, progress_interval_seconds FROM health.jobs ORDER BY 1")
    return [tuple(r) for r in executors], [tuple(r) for r in jobs]


def random_batch(rng: random.Random, n: int) -> list[Heartbeat]:
    beats = []
    for _ in range(n):
        ex = f"ex{rng.randrange(5)}"
        job = rng.choice([None, "j1", "j2", "j3"])
        beats.append(Heartbeat(
            executor_id=ex, node_id=f"n-{ex}", group=rng.choice(["g", "h"]), job_id=job,
            epoch=None if job is None else rng.choice([1, 2, 3]), accepting=job is None,
            phase=rng.choice([Phase.TRAINING, Phase.TRAINING, Phase.CHECKPOINTING, Phase.IDLE]),
            step=rng.choice([None, 5, 5, 6]),
            # Whole seconds, so several heartbeats share a send time; a few from a clock ahead of the service's.
            sent_at=T0 + timedelta(seconds=rng.choice([rng.randrange(12), 400])),
            interval_seconds=rng.choice([30, 10]), progress_interval_seconds=30))
    return beats


async def test_a_batch_leaves_every_row_as_its_heartbeats_one_by_one_did(env):
    rng = random.Random(12)
    async with migrated(env, HealthSettings, store.SCHEMA, "services.health") as (_, conn):
        # Starting rows: a registered executor without heartbeats, jobs known from their events.
        await conn.execute("INSERT INTO health.executors (executor_id, node_id, group_name, registered_at)"
                           " VALUES ('ex0', 'n-ex0', 'g', $1)", T0)
        await conn.execute("INSERT INTO health.jobs (job_id, state, event_seq, epoch, executor_id,"
                           " last_contact_at, step_changed_at) VALUES ('j1', 'running', 3, 2, 'ex1', $1, $1),"
                           " ('j2', 'running', 2, 1, 'ex2', $1, $1)", T0 + timedelta(seconds=4))
        for round_ in range(40):
            batch = random_batch(rng, rng.choice([2, 6, 30]))
            tx = conn.transaction()
            await tx.start()
            await one_by_one(conn, batch)
            expected = await rows(conn)
            await tx.rollback()
            async with conn.transaction():
                sent = await batched(conn, batch)
            assert await rows(conn) == expected, (round_, batch)
            # The epochs, then one upsert per table and round: as many as the most heartbeats of one executor
            # (and of one job), not one per heartbeat.
            most = max(Counter(b.executor_id for b in batch).values())
            most_job = max(Counter(b.job_id for b in batch if b.job_id).values(), default=0)
            assert len(sent) <= 1 + most + most_job, sent
