"""The budget service against real NATS and PostgreSQL: usage samples become ledger totals (a redelivered
sample counted once), exhaustion is published once per ceiling, the status RPC answers, a requeue's new
ceiling is kept in the history, and the first-checkpoint warning comes from the user's estimate."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import asyncpg
import pytest

from libs.contracts.budget import BudgetEvent, BudgetStatusReply, BudgetStatusRequest
from libs.contracts.jobs import JobEvent, JobSpec, JobState
from libs.contracts.telemetry import Heartbeat, Phase, StepReport, UsageSample
from libs.runtime.bus import publish
from services.budget.app import serve
from services.budget.settings import BudgetSettings
from tests.integration.helpers_hba import collect, jetstream
from tests.support import builders
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration


def usage_beat(job: str, seq: int, *, epoch: int = 1, devices: int = 2, wall: float = 1.0,
               executor: str = "ex1") -> Heartbeat:
    return builders.heartbeat(executor, node_id="n1", job_id=job, epoch=epoch, phase=Phase.TRAINING, step=seq,
                              sent_at=datetime.now(UTC), interval_seconds=1, progress_interval_seconds=1,
                              usage=UsageSample(job_id=job, epoch=epoch, seq=seq, devices=devices, wall_seconds=wall))


async def test_ledger_exhaustion_rpc_and_requeue(env):
    # The samples below stand for minutes of running sent in a moment: the grant's time bound is not what is
    # tested here (tests/unit/test_usage_grants.py, tests/security/test_forged_usage.py).
    settings = env.settings(BudgetSettings, usage_clock_slack_seconds=3600)
    s = settings.subjects
    spec = JobSpec.model_validate({"workload": {"kind": "finetune"}, "gpu_ceiling_seconds": 10,
                                   "checkpoint_every_steps": 50, "estimated_step_seconds": 1.0,
                                   "gpus_per_worker": 2})
    pg = await asyncpg.connect(env.database_url)
    async with running(serve, settings), jetstream(settings.nats_url) as (nc, js), \
            collect(settings.nats_url, s.budget_all) as budget:

        def events(kind: str) -> list[BudgetEvent]:
            return [e for e in (BudgetEvent.decode(m.data) for m in budget.msgs) if e.event == kind]

        async def consumed() -> float | None:
            return await pg.fetchval("SELECT consumed_seconds FROM budget.jobs_public WHERE job_id = 'j1'")

        await publish(js, s.job_event("j1", "submitted"), JobEvent(
            job_id="j1", seq=1, event="submitted", state=JobState.QUEUED,
            detail={"spec": spec.model_dump(mode="json"), "owner": "alice"}))
        # The user's estimate already says the first checkpoint (50 steps x 1 s x 2 devices) cannot fit in 10.
        (warning,) = await eventually(lambda: asyncio.sleep(0, events("warning")))
        assert warning.detail["expected_seconds"] == 100.0 and warning.ceiling_seconds == 10.0
        await publish(js, s.job_event("j1", "leased"), JobEvent(job_id="j1", seq=2, event="leased",
                                                                state=JobState.RUNNING, epoch=1, executor_id="ex1"))
        for seq in (1, 2, 2, 3):  # the second seq 2 is a new heartbeat carrying an already-counted sample
            await publish(js, s.heartbeat("ex1"), usage_beat("j1", seq))
        assert await eventually(lambda: _equals(consumed, 6.0))
        assert await pg.fetchval("SELECT count(*) FROM budget.ledger WHERE job_id = 'j1'") == 3
        assert events("exhausted") == []

        for seq in (4, 5, 6):  # 10 reaches the ceiling; 12 overshoots while the job stops
            await publish(js, s.heartbeat("ex1"), usage_beat("j1", seq))
        assert await eventually(lambda: _equals(consumed, 12.0))
        (ex,) = await eventually(lambda: asyncio.sleep(0, events("exhausted")))
        assert ex.job_id == "j1" and ex.ceiling_seconds == 10.0 and ex.consumed_seconds >= 10.0

        reply = BudgetStatusReply.decode((await nc.request(
            s.rpc_budget_status, BudgetStatusRequest(job_id="j1").encode(), timeout=5)).data)
        assert reply.known and reply.ceiling_seconds == 10.0 and reply.consumed_seconds == 12.0
        unknown = BudgetStatusReply.decode((await nc.request(
            s.rpc_budget_status, BudgetStatusRequest(job_id="nope").encode(), timeout=5)).data)
        assert not unknown.known and unknown.consumed_seconds == 0

        await publish(js, s.job_event("j1", "interrupted"), JobEvent(
            job_id="j1", seq=3, event="interrupted", state=JobState.INTERRUPTED, reason="gpu_ceiling"))
        await publish(js, s.job_event("j1", "requeued"), JobEvent(
            job_id="j1", seq=4, event="requeued", state=JobState.QUEUED,
            detail={"gpu_ceiling_seconds": 80.0, "actor": "operator-1", "consumed_seconds": 12.0}))
        await publish(js, s.job_event("j1", "leased"), JobEvent(job_id="j1", seq=5, event="leased",
                                                                state=JobState.RUNNING, epoch=2, executor_id="ex2"))
        await eventually(lambda: pg.fetchval("SELECT epoch = 2 FROM budget.jobs WHERE job_id = 'j1'"))
        # A late sample at the old epoch (ex1 ran on until it noticed its lease was gone): really used, charged.
        await publish(js, s.heartbeat("ex1"), usage_beat("j1", 7, epoch=1))
        await publish(js, s.heartbeat("ex2"), usage_beat("j1", 1, epoch=2, devices=1, wall=66.0, executor="ex2"))
        assert await eventually(lambda: _equals(consumed, 80.0))
        await eventually(lambda: asyncio.sleep(0, len(events("exhausted")) == 2))
        row = await pg.fetchrow("SELECT * FROM budget.jobs_public WHERE job_id = 'j1'")
        assert row["ceiling_seconds"] == 80.0 and row["remaining_seconds"] == 0 and row["overshoot_seconds"] == 2.0
        history = json.loads(row["ceiling_history"])
        assert [(h["ceiling_seconds"], h["actor"]) for h in history] == [(10.0, "alice"), (80.0, "operator-1")]
        assert json.loads(row["warning"])["ceiling_seconds"] == 10.0
        assert len(events("exhausted")) == 2 and len(events("warning")) == 1

        with pytest.raises(asyncpg.RaiseError):  # the ledger is append-only
            await pg.execute("DELETE FROM budget.ledger")
    await pg.close()


async def _equals(fn, value: float) -> bool:
    return await fn() == value


async def test_measured_step_time_gives_the_checkpoint_eta_and_a_warning(env):
    settings = env.settings(BudgetSettings)
    s = settings.subjects
    spec = JobSpec.model_validate({"workload": {"kind": "finetune"}, "gpu_ceiling_seconds": 100,
                                   "checkpoint_every_steps": 50, "workers": 2, "gpus_per_worker": 1})
    pg = await asyncpg.connect(env.database_url)
    async with running(serve, settings), jetstream(settings.nats_url) as (nc, js), \
            collect(settings.nats_url, s.budget("j2", "warning")) as warnings:
        await publish(js, s.job_event("j2", "submitted"), JobEvent(
            job_id="j2", seq=1, event="submitted", state=JobState.QUEUED,
            detail={"spec": spec.model_dump(mode="json"), "owner": "bob"}))
        await eventually(lambda: pg.fetchval("SELECT ceiling_seconds FROM budget.jobs WHERE job_id = 'j2'"))
        assert warnings.msgs == []  # no estimate: nothing to warn about yet
        await publish(js, s.progress("j2", "ex1"), StepReport(job_id="j2", epoch=1, executor_id="ex1", step=10,
                                                        step_seconds=2.0))
        row = await eventually(lambda: pg.fetchrow(
            "SELECT * FROM budget.jobs_public WHERE job_id = 'j2' AND (checkpoint->>'last_step') = '10'"))
        assert json.loads(row["checkpoint"])["next_eta_seconds"] == 80.0  # 40 steps x 2 s
        # 50 steps x 2 s x 2 devices = 200 GPU-seconds > 100
        (w,) = await eventually(lambda: asyncio.sleep(0, warnings.msgs))
        ev = BudgetEvent.decode(w.data)
        assert ev.detail["expected_seconds"] == 200.0 and ev.ceiling_seconds == 100.0
    await pg.close()
