"""The health service against real NATS and PostgreSQL: silence becomes no_signal, a standing step while
training becomes stuck, a terminal job drops its signal, and stale-epoch heartbeats never reach a job."""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import UTC, datetime

import asyncpg
import pytest

from libs.contracts.jobs import JobEvent, JobState
from libs.contracts.nodes import NodeRegistered, Signal, SignalChanged
from libs.contracts.telemetry import Heartbeat, Phase
from libs.runtime.bus import publish
from services.health.app import serve
from services.health.settings import HealthSettings

from tests.integration.helpers_hba import collect, jetstream
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration


def beat(executor: str, job: str | None, *, epoch: int | None = 1, step: int | None = 0,
         phase: Phase = Phase.TRAINING) -> Heartbeat:
    return Heartbeat(executor_id=executor, node_id=f"node-{executor}", group="g1", job_id=job, epoch=epoch,
                     phase=phase, step=step, sent_at=datetime.now(UTC), interval_seconds=0.2,
                     progress_interval_seconds=0.2, accepting=job is None)


def job_event(job: str, seq: int, state: JobState, event: str, epoch: int = 1, executor: str = "ex1") -> JobEvent:
    return JobEvent(job_id=job, seq=seq, event=event, state=state, epoch=epoch, executor_id=executor)


@contextlib.asynccontextmanager
async def heartbeating(js, subjects, make, every: float = 0.2):
    """Publish make(i) every ``every`` seconds until the block ends."""
    async def loop():
        i = 0
        while True:
            hb = make(i)
            await publish(js, subjects.heartbeat(hb.executor_id), hb)
            i += 1
            await asyncio.sleep(every)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def signals_of(col, job: str) -> list[Signal | None]:
    changes = [SignalChanged.decode(m.data) for m in col.msgs if m.subject.endswith(".signal")]
    return [c.signal for c in changes if c.job_id == job]


async def test_silence_becomes_no_signal_and_a_terminal_event_clears_it(env):
    settings = env.settings(HealthSettings, evaluate_interval_seconds=0.2)  # heartbeat 1 s: timeout 2 s
    s = settings.subjects
    pg = await asyncpg.connect(env.database_url)
    async with running(serve, settings), jetstream(settings.nats_url) as (_, js), \
            collect(settings.nats_url, s.job_event("j1", "signal")) as col:
        await publish(js, s.node("node-ex1", "registered"), NodeRegistered(
            node_id="node-ex1", executor_id="ex1", group="g1", hostname="h", cpu_count=2, agent_version="t"))
        await publish(js, s.job_event("j1", "started"), job_event("j1", 2, JobState.RUNNING, "started"))
        async with heartbeating(js, s, lambda i: beat("ex1", "j1", step=i)):
            await eventually(lambda: asyncio.sleep(0, signals_of(col, "j1")[-1:] == [Signal.OK]))
            row = await eventually(lambda: pg.fetchrow(
                "SELECT * FROM health.executors_public WHERE executor_id = 'ex1' AND signal = 'ok'"))
            assert row["group_name"] == "g1" and row["job_id"] == "j1" and row["phase"] == "training"
        silent_at = asyncio.get_running_loop().time()
        await eventually(lambda: asyncio.sleep(0, Signal.NO_SIGNAL in signals_of(col, "j1")), timeout=6)
        assert asyncio.get_running_loop().time() - silent_at >= 1.5  # not before the 2 s timeout, give or take
        ev = next(SignalChanged.decode(m.data) for m in col.msgs if SignalChanged.decode(m.data).signal == "no_signal")
        assert ev.previous == Signal.OK and ev.executor_id == "ex1" and ev.no_signal_after_seconds == 2.0
        ex = await eventually(lambda: pg.fetchrow(
            "SELECT * FROM health.executors_public WHERE executor_id = 'ex1' AND signal = 'no_signal'"))
        assert ex["detail"] and ex["signal_since"] is not None
        job = await pg.fetchrow("SELECT * FROM health.job_signals_public WHERE job_id = 'j1'")
        assert job["signal"] == "no_signal" and job["executor_id"] == "ex1"

        await publish(js, s.job_event("j1", "succeeded"), job_event("j1", 3, JobState.SUCCEEDED, "succeeded"))
        await eventually(lambda: asyncio.sleep(0, signals_of(col, "j1")[-1] is None))
        assert signals_of(col, "j1") == [Signal.OK, Signal.NO_SIGNAL, None]  # each change published once
        assert await pg.fetchval("SELECT signal FROM health.job_signals_public WHERE job_id = 'j1'") is None
    await pg.close()


async def test_a_standing_step_while_training_is_stuck_and_a_queued_job_never(env):
    settings = env.settings(HealthSettings, evaluate_interval_seconds=0.2, stuck_after_seconds=1.0)
    s = settings.subjects
    pg = await asyncpg.connect(env.database_url)
    async with running(serve, settings), jetstream(settings.nats_url) as (_, js), \
            collect(settings.nats_url, s.job_all) as col:
        await publish(js, s.job_event("j2", "started"), job_event("j2", 1, JobState.RUNNING, "started", executor="ex2"))
        await publish(js, s.job_event("j3", "queued"), job_event("j3", 1, JobState.QUEUED, "requeued", executor="ex3"))
        # Job events and heartbeats are two streams read by two consumers: a heartbeat read before its job's first
        # event is judged by the executor alone (state unknown, as at a real job's start: "ok"). This test is about
        # a job health knows is queued, so the heartbeats start once both states are stored (a CI run under load
        # read ex3's first heartbeats first and saw j3 "ok", then nothing, once its event arrived).
        await eventually(lambda: pg.fetchval(
            "SELECT count(*) = 2 FROM health.jobs WHERE job_id IN ('j2', 'j3') AND state IS NOT NULL"))
        started = asyncio.get_running_loop().time()

        def two(i):  # ex2 trains j2 at a fixed step; ex3 still names queued j3 at a fixed step
            return beat("ex2", "j2", step=7) if i % 2 == 0 else beat("ex3", "j3", step=3)

        async with heartbeating(js, s, two, every=0.1):
            await eventually(lambda: asyncio.sleep(0, Signal.STUCK in signals_of(col, "j2")), timeout=6)
            took = asyncio.get_running_loop().time() - started
            assert 1.0 <= took < 4.0  # threshold 1 s, evaluated every 0.2 s
            row = await eventually(lambda: pg.fetchrow(
                "SELECT * FROM health.executors_public WHERE executor_id = 'ex2' AND signal = 'stuck'"))
            assert json.loads(row["detail"])["stuck_after_seconds"] == 1.0
            await asyncio.sleep(0.5)
        assert signals_of(col, "j3") == []  # queued: a signal does not apply
        assert await pg.fetchval("SELECT signal FROM health.job_signals_public WHERE job_id = 'j3'") is None
    await pg.close()


async def test_heartbeats_about_an_old_epoch_never_reach_the_job(env):
    settings = env.settings(HealthSettings, evaluate_interval_seconds=0.2)
    s = settings.subjects
    pg = await asyncpg.connect(env.database_url)
    async with running(serve, settings), jetstream(settings.nats_url) as (_, js):
        await publish(js, s.job_event("j4", "leased"), job_event("j4", 1, JobState.RUNNING, "leased", epoch=2))
        await eventually(lambda: pg.fetchval("SELECT epoch = 2 FROM health.jobs WHERE job_id = 'j4'"))
        await publish(js, s.heartbeat("zombie"), beat("zombie", "j4", epoch=1, step=99))
        await publish(js, s.heartbeat("ex4"), beat("ex4", "j4", epoch=2, step=5))
        row = await eventually(lambda: pg.fetchrow("SELECT * FROM health.jobs WHERE job_id = 'j4' AND step = 5"))
        await eventually(lambda: pg.fetchval("SELECT count(*) = 2 FROM health.executors"))
        assert row["executor_id"] == "ex4" and row["epoch"] == 2  # the zombie's step 99 never landed
        # A malformed heartbeat is refused, not retried forever, and the next ones still flow.
        async with collect(settings.nats_url, s.rejected("health")) as rejected:
            await js.publish(s.heartbeat("ex4"), b'{"schema": "teto.hb/1", "executor_id": 5}')
            await publish(js, s.heartbeat("ex4"), beat("ex4", "j4", epoch=2, step=6))
            await eventually(lambda: pg.fetchval("SELECT step = 6 FROM health.jobs WHERE job_id = 'j4'"))
            await eventually(lambda: asyncio.sleep(0, rejected.msgs))
    await pg.close()


async def test_a_stored_heartbeat_is_judged_at_once_not_at_the_next_tick(env):
    # A tick of a minute: only the wake from the heartbeat batch's transaction can judge the executor in time.
    settings = env.settings(HealthSettings, evaluate_interval_seconds=60)
    s = settings.subjects
    pg = await asyncpg.connect(env.database_url)
    try:
        async with running(serve, settings), jetstream(settings.nats_url) as (_, js):
            await eventually(lambda: pg.fetchval("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'"))
            await publish(js, s.heartbeat("ex1"), beat("ex1", None, step=None, phase=Phase.IDLE))
            await eventually(lambda: pg.fetchval("SELECT signal FROM health.executors WHERE executor_id = 'ex1'"
                                                 " AND signal = 'ok'"), what="ex1 judged ok within the minute")
    finally:
        await pg.close()
