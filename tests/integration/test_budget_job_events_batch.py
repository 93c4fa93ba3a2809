"""The budget applies a batch of job events in a few statements whatever its size (services/budget/jobevents.py:
every job locked and read once with its latest ceiling, the events folded in memory, the jobs and the ceiling
history written in one statement) and
leaves each job, ceiling history and emitted event exactly as applying the events one by one, a statement each,
did (tests/integration/helpers_budget_events.py, the code the service ran before)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from libs.contracts.jobs import JobEvent, JobSpec, JobState
from services.budget import store
from services.budget.domain.usage import Charge
from services.budget.grants import Admission
from services.budget.jobevents import apply_job_events
from services.budget.settings import BudgetSettings
from tests.integration.helpers_budget_events import apply_one
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
    """Every row; of ``updated_at`` only whether this transaction wrote it (two transactions differ in now())."""
    jobs = await conn.fetch("SELECT *, updated_at = now() AS touched FROM budget.jobs ORDER BY job_id")
    ceilings = await conn.fetch("SELECT job_id, event_seq, ceiling_seconds, actor, reason, consumed_seconds, set_at"
                                " FROM budget.ceilings ORDER BY 1, 2")
    return ([{k: v for k, v in r.items() if k != "updated_at"} for r in jobs], [tuple(r) for r in ceilings])


def emitted(effects: store.Effects) -> list:
    return [(subj, e.model_dump(exclude={"id", "time"})) for subj, e in effects.events]


async def both_ways(conn: asyncpg.Connection, s, events: list[JobEvent]) -> tuple[list[str], list]:
    """Apply ``events`` one by one (rolled back), then as a batch; assert the same end; the batch's statements."""
    tx = conn.transaction()
    await tx.start()
    one = store.Effects()
    for ev in sorted(events, key=lambda e: (e.job_id, e.seq)):
        one.events += (await apply_one(conn, ev, s)).events
    expected = await snapshot(conn)
    await tx.rollback()
    async with conn.transaction():
        with statements(conn, "budget.") as sent:
            batch = await apply_job_events(conn, events, s)
        got = await snapshot(conn)
    assert got == expected
    assert emitted(batch) == emitted(one)
    return sent, emitted(batch)


async def test_a_batch_is_two_statements_and_ends_as_one_by_one(env):
    events = [ev for j in ("j3", "j1", "j2") for ev in lifecycle(j)]
    async with migrated(env, BudgetSettings, store.SCHEMA, "services.budget") as (settings, conn):
        # Before: a lock (2 statements), a state update and an account write per event, more for submissions.
        sent, announced = await both_ways(conn, settings.subjects, events)
        assert [subj.rsplit(".", 1)[-1] for subj, _ in announced] == ["warning"] * 3
        # New jobs: read and lock (none there), create, read and lock; the ceilings with the jobs.
        assert len(sent) == 4 and len([q for q in sent if "FOR UPDATE" in q]) == 2, sent
        assert "INSERT INTO budget.ceilings" in sent[-1] and "UPDATE budget.jobs" in sent[-1], sent[-1]
        # Known jobs: read and lock, the ceilings (a requeue with a new one) with the jobs.
        again = [JobEvent(job_id=j, seq=5, event="requeued", state=JobState.QUEUED, time=T0,
                          previous_state=JobState.SUCCEEDED, detail={"gpu_ceiling_seconds": 20.0, "actor": "carol"})
                 for j in ("j2", "j1")]
        sent, _ = await both_ways(conn, settings.subjects, again)
        assert len(sent) == 2, sent


def random_events(rng: random.Random, jobs: list[str]) -> list[JobEvent]:
    """Events of a few jobs in any order: submissions, requeues with and without a ceiling, runs starting and
    ending, terminal states, redeliveries (the same seq again) and seqs at or below what is stored."""
    out = []
    for job in rng.sample(jobs, rng.randint(1, len(jobs))):
        for _ in range(rng.randint(1, 6)):
            seq = rng.randint(1, 12)
            at = T0 + timedelta(seconds=seq, microseconds=rng.randint(0, 999_999))
            kind = rng.choice(["submitted", "requeued", "requeued", "leased", "started", "succeeded", "failed",
                               "interrupted"])
            state = {"submitted": JobState.QUEUED, "requeued": JobState.QUEUED, "leased": JobState.ADMITTING,
                     "started": JobState.RUNNING, "succeeded": JobState.SUCCEEDED, "failed": JobState.FAILED,
                     "interrupted": JobState.INTERRUPTED}[kind]
            previous = rng.choice([None, JobState.QUEUED, JobState.ADMITTING, JobState.RUNNING])
            detail: dict = {}
            if kind == "submitted":
                spec = SPEC.model_copy(update={"gpu_ceiling_seconds": rng.choice([5.0, 10.0, 50.0, 500.0])})
                detail = {"spec": spec.model_dump(mode="json"), "owner": rng.choice(["alice", "bob"])}
                if rng.random() < 0.5:
                    detail["org"] = rng.choice(["org-a", "org-b"])
            elif kind == "requeued" and rng.random() < 0.7:
                detail = {"gpu_ceiling_seconds": rng.choice([8.0, 20.0, 100.0]), "actor": "carol"}
            ev = JobEvent(job_id=job, seq=seq, event=kind, state=state, previous_state=previous,
                          epoch=rng.choice([None, 1, 2, 3]), time=at, detail=detail)
            out.append(ev)
            if rng.random() < 0.2:
                out.append(ev.model_copy())  # redelivered within the batch
    rng.shuffle(out)
    return out


async def test_random_batches_end_as_one_by_one_over_rows_already_there(env):
    rng = random.Random(1213)
    jobs = [f"job-{i}" for i in range(5)]
    async with migrated(env, BudgetSettings, store.SCHEMA, "services.budget") as (settings, conn):
        s = settings.subjects
        for round_ in range(40):
            events = random_events(rng, jobs)
            sent, _ = await both_ways(conn, s, events)
            assert len(sent) <= 5, sent
            # Leave something behind for the next round to build on: the batch's effect, and some usage charged
            # (accounts near or past their ceilings, so requeues and submissions decide exhaustion).
            async with conn.transaction():
                await apply_job_events(conn, random_events(rng, jobs), s)
                await store.record_usage(conn, [Charge(job, "ex1", 1, round_ + 1, 1, rng.choice([1.0, 4.0, 9.0]))
                                                for job in rng.sample(jobs, 2)], s)
        assert await conn.fetchval("SELECT count(*) FROM budget.ceilings") > 10
        assert await conn.fetchval("SELECT count(*) FROM budget.jobs WHERE exhausted_for_ceiling IS NOT NULL") > 0


async def test_a_held_record_is_charged_when_its_leased_event_commits_after_the_job_s_end(env):
    """The budget's replicas share the job events' consumer: the batch holding a job's ``leased`` event can commit
    after the one holding its later events, even its end. A record that overtook them all is held throughout and
    charged when the grant comes (it was refused as soon as the job's epoch moved without it)."""
    events = lifecycle("jo")
    submitted, leased, later = events[0], events[1], events[2:]
    admission = Admission(T0 + timedelta(seconds=60))
    record = Charge("jo", "ex1", 1, 1, 1, 0.05, last=True)
    async with migrated(env, BudgetSettings, store.SCHEMA, "services.budget") as (settings, conn):
        s = settings.subjects
        async with conn.transaction():
            await apply_job_events(conn, [submitted], s, admission)
        async with conn.transaction():
            assert (await store.record_usage(conn, [record], s, admission)).held == 1
        async with conn.transaction():  # started, then succeeded: epoch 1 and the end, without the grant
            effects = await apply_job_events(conn, later, s, admission)
        assert (effects.held, effects.refused) == (1, 0)
        assert await conn.fetchval("SELECT count(*) FROM budget.ledger") == 0
        async with conn.transaction():  # the leased event at last: nothing about the job moves but its grant
            effects = await apply_job_events(conn, [leased], s, admission)
        assert (effects.inserted, effects.held, effects.refused) == (1, 0, 0)
        assert await conn.fetchval("SELECT sum(gpu_seconds) FROM budget.ledger WHERE job_id = 'jo'") == 0.05
        assert await conn.fetchval("SELECT count(*) FROM budget.held_usage") == 0


async def test_a_job_leased_before_its_submission_reached_the_budget_is_charged_its_devices(env):
    """The ``leased`` event commits before the submission (another replica's batch): the grant cannot say how many
    devices yet. A record of the job's two GPUs is held, then charged when the submission fills the grant in (it
    was refused: 2 devices claimed, 1 granted)."""
    spec = SPEC.model_copy(update={"gpus_per_worker": 2, "gpu_ceiling_seconds": 1000.0})
    submitted = JobEvent(job_id="jd", seq=1, event="submitted", state=JobState.QUEUED, time=T0,
                         detail={"spec": spec.model_dump(mode="json"), "owner": "alice"})
    leased = JobEvent(job_id="jd", seq=2, event="leased", state=JobState.RUNNING, epoch=1, executor_id="ex1",
                      time=T0 + timedelta(seconds=1), previous_state=JobState.QUEUED, detail={"workers": ["ex1"]})
    admission = Admission(T0 + timedelta(seconds=60))
    record = Charge("jd", "ex1", 1, 1, 2, 10.0)
    async with migrated(env, BudgetSettings, store.SCHEMA, "services.budget") as (settings, conn):
        s = settings.subjects
        async with conn.transaction():
            await apply_job_events(conn, [leased], s, admission)
        async with conn.transaction():
            effects = await store.record_usage(conn, [record], s, admission)
        assert (effects.inserted, effects.held, effects.refused) == (0, 1, 0)
        async with conn.transaction():
            effects = await apply_job_events(conn, [submitted], s, admission)
        assert (effects.inserted, effects.held, effects.refused) == (1, 0, 0)
        assert await conn.fetchval("SELECT devices FROM budget.grants WHERE job_id = 'jd'") == 2
        assert await conn.fetchval("SELECT consumed_seconds FROM budget.jobs WHERE job_id = 'jd'") == 20.0
