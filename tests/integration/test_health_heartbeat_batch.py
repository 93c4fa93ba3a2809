"""Health writes a batch of heartbeats in a fixed number of statements (services/health/store.py) and leaves
every executor and job row exactly as the per-heartbeat upserts it replaced did, written one by one in send
order: the oracle below is those statements as they were. Random batches with flaps (checkpointing ->
training), standing then moving steps, late and out-of-order heartbeats and stale epochs, against real
PostgreSQL, from the same starting rows each time."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from libs.contracts.telemetry import Heartbeat, Phase
from libs.runtime.fencing import is_stale
from services.health import store
from services.health.settings import HealthSettings
from tests.integration.helpers_sql import migrated, statements

pytestmark = pytest.mark.integration

# The per-heartbeat upserts as they were before the batch write (the oracle).
ONE_EXECUTOR = """
INSERT INTO health.executors AS e (executor_id, node_id, group_name, gpus, accepting, phase, step, job_id, epoch,
    last_heartbeat, step_changed_at, heartbeat_interval_seconds, progress_interval_seconds, updated_at)
VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $9, $10, $10, $11, $12, now())
ON CONFLICT (executor_id) DO UPDATE SET
    node_id = EXCLUDED.node_id, group_name = EXCLUDED.group_name, gpus = EXCLUDED.gpus,
    accepting = EXCLUDED.accepting, phase = EXCLUDED.phase, step = EXCLUDED.step, job_id = EXCLUDED.job_id,
    epoch = EXCLUDED.epoch, last_heartbeat = EXCLUDED.last_heartbeat,
    step_changed_at = CASE
        WHEN e.step IS DISTINCT FROM EXCLUDED.step OR e.phase IS DISTINCT FROM EXCLUDED.phase
          OR e.job_id IS DISTINCT FROM EXCLUDED.job_id OR e.epoch IS DISTINCT FROM EXCLUDED.epoch
          OR e.step_changed_at IS NULL
        THEN EXCLUDED.last_heartbeat ELSE e.step_changed_at END,
    heartbeat_interval_seconds = EXCLUDED.heartbeat_interval_seconds,
    progress_interval_seconds = EXCLUDED.progress_interval_seconds, updated_at = now()
WHERE e.last_heartbeat IS NULL OR EXCLUDED.last_heartbeat >= e.last_heartbeat
"""
ONE_JOB = """
INSERT INTO health.jobs AS j (job_id, epoch, executor_id, last_contact_at, phase, step, step_changed_at,
    progress_interval_seconds, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $4, $7, now())
ON CONFLICT (job_id) DO UPDATE SET
    epoch = EXCLUDED.epoch, executor_id = EXCLUDED.executor_id, last_contact_at = EXCLUDED.last_contact_at,
    phase = EXCLUDED.phase, step = EXCLUDED.step,
    step_changed_at = CASE
        WHEN j.step IS DISTINCT FROM EXCLUDED.step OR j.phase IS DISTINCT FROM EXCLUDED.phase
          OR j.epoch IS DISTINCT FROM EXCLUDED.epoch OR j.step_changed_at IS NULL
        THEN EXCLUDED.last_contact_at ELSE j.step_changed_at END,
    progress_interval_seconds = EXCLUDED.progress_interval_seconds, updated_at = now()
WHERE EXCLUDED.epoch >= j.epoch AND (j.last_contact_at IS NULL OR EXCLUDED.last_contact_at >= j.last_contact_at)
"""

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=5)


async def one_by_one(conn: asyncpg.Connection, beats: list[Heartbeat]) -> None:
    """The handler as it was: epochs read, stale ones kept off the jobs, then each heartbeat upserted alone."""
    epochs = {r["job_id"]: r["epoch"] for r in await conn.fetch("SELECT job_id, epoch FROM health.jobs")}
    job_beats = [b for b in beats if b.job_id and not is_stale(b.epoch or 0, epochs.get(b.job_id, 0))]
    for b in sorted(job_beats, key=lambda b: (b.job_id, b.sent_at)):
        await conn.execute(ONE_JOB, b.job_id, b.epoch or 0, b.executor_id, min(b.sent_at, NOW), str(b.phase), b.step,
                           b.progress_interval_seconds)
    for b in sorted(beats, key=lambda b: (b.executor_id, b.sent_at)):
        await conn.execute(ONE_EXECUTOR, b.executor_id, b.node_id, b.group,
                           json.dumps([g.model_dump(mode="json") for g in b.gpus]), b.accepting, str(b.phase), b.step,
                           b.job_id, b.epoch, min(b.sent_at, NOW), b.interval_seconds, b.progress_interval_seconds)


async def batched(conn: asyncpg.Connection, beats: list[Heartbeat]) -> list[str]:
    """The handler as it is (services/health/handlers.py on_heartbeats); the statements it sent."""
    with statements(conn, "health.") as sent:
        jobs = await store.job_contacts(conn, sorted({b.job_id for b in beats if b.job_id}))
        job_beats, _ = store.split_stale(beats, jobs)
        await store.record_heartbeats(conn, beats, jobs, job_beats, NOW)
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
            # Lock, read and write for each table, whatever the number of heartbeats.
            assert len(sent) <= 6, sent
