"""The budget applies a batch of job events with every job locked once for the batch
(services/budget/store.py ``apply_job_events``) and leaves each job, ceiling history and emitted event exactly
as applying the events one by one did; an event that changes no account writes none."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from libs.contracts.jobs import JobEvent, JobSpec, JobState
from services.budget import store
from services.budget.settings import BudgetSettings
from tests.integration.helpers_sql import migrated, statements

pytestmark = pytest.mark.integration

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SPEC = JobSpec.model_validate({"workload": {"kind": "finetune"}, "gpu_ceiling_seconds": 10,
                               "checkpoint_every_steps": 100, "estimated_step_seconds": 1.0})


def lifecycle(job: str) -> list[JobEvent]:
    at = [T0 + timedelta(seconds=i) for i in range(6)]
    return [
        JobEvent(job_id=job, seq=1, event="submitted", state=JobState.QUEUED, time=at[0],
                 detail={"spec": SPEC.model_dump(mode="json"), "owner": "alice"}),
        JobEvent(job_id=job, seq=2, event="leased", state=JobState.ADMITTING, epoch=1, executor_id="ex1", time=at[1],
                 previous_state=JobState.QUEUED),
        JobEvent(job_id=job, seq=3, event="started", state=JobState.RUNNING, epoch=1, executor_id="ex1", time=at[2],
                 previous_state=JobState.ADMITTING),
        JobEvent(job_id=job, seq=3, event="started", state=JobState.RUNNING, epoch=1, executor_id="ex1", time=at[2],
                 previous_state=JobState.ADMITTING),  # redelivered
        JobEvent(job_id=job, seq=4, event="succeeded", state=JobState.SUCCEEDED, epoch=1, time=at[3],
                 previous_state=JobState.RUNNING),
    ]


async def snapshot(conn: asyncpg.Connection) -> tuple:
    jobs = await conn.fetch("SELECT * FROM budget.jobs ORDER BY job_id")
    ceilings = await conn.fetch("SELECT job_id, event_seq, ceiling_seconds, actor, reason, consumed_seconds, set_at"
                                " FROM budget.ceilings ORDER BY 1, 2")
    return ([{k: v for k, v in r.items() if k != "updated_at"} for r in jobs], [tuple(r) for r in ceilings])


async def test_a_batch_locks_each_job_once_and_ends_as_one_by_one(env):
    events = [ev for j in ("j3", "j1", "j2") for ev in lifecycle(j)]
    async with migrated(env, BudgetSettings, store.SCHEMA, "services.budget") as (settings, conn):
        s = settings.subjects
        tx = conn.transaction()
        await tx.start()
        one = store.Effects()
        for ev in sorted(events, key=lambda e: (e.job_id, e.seq)):
            one.events += (await store.apply_job_event(conn, ev, s)).events
        expected = await snapshot(conn)
        await tx.rollback()
        with statements(conn, "budget.") as sent:
            async with conn.transaction():
                batch = await store.apply_job_events(conn, events, s)
        assert await snapshot(conn) == expected
        assert [(subj, e.model_dump(exclude={"id", "time"})) for subj, e in batch.events] == \
            [(subj, e.model_dump(exclude={"id", "time"})) for subj, e in one.events]
        # Before: a lock (2 statements), a state update and an account write per event, more for submissions.
        assert len([q for q in sent if "FOR UPDATE" in q]) == 1
        assert len(sent) <= 2 + 2 * len(events) + 4 * 3, len(sent)
