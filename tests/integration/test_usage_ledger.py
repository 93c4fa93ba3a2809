"""No GPU-second unaccounted, against the real budget service (NATS + PostgreSQL): usage reports outlive a
budget outage longer than the heartbeats' retention, a record of an old lease epoch sent again after a
partition is charged once, a duplicate is charged once, and every job's total reconciles with its ledger."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from libs.contracts.jobs import JobEvent, JobSpec, JobState
from libs.contracts.telemetry import Heartbeat, Phase, UsageSample
from libs.contracts.usage import UsageRecord, UsageReport
from libs.runtime import db
from libs.runtime.bus import publish
from services.budget import store
from services.budget.app import serve
from services.budget.settings import BudgetSettings
from tests.integration.helpers_hba import jetstream
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration
T0 = datetime(2026, 12, 1, 4, 0, tzinfo=UTC)


def record(job: str, seq: int, *, epoch: int = 1, devices: int = 1, wall: float = 1.0) -> UsageRecord:
    start = T0 + timedelta(seconds=seq)
    return UsageRecord(job_id=job, epoch=epoch, seq=seq, devices=devices, wall_seconds=wall, started_at=start,
                       ended_at=start + timedelta(seconds=wall))


def report(executor: str, *records: UsageRecord) -> UsageReport:
    return UsageReport(executor_id=executor, node_id=f"node-{executor}", records=list(records))


async def submitted(js, s, job: str, ceiling: float = 1000.0, gpus: int = 0) -> None:
    spec = JobSpec.model_validate({"workload": {"kind": "finetune"}, "gpu_ceiling_seconds": ceiling,
                                   "gpus_per_worker": gpus})
    await publish(js, s.job_event(job, "submitted"), JobEvent(
        job_id=job, seq=1, event="submitted", state=JobState.QUEUED,
        detail={"spec": spec.model_dump(mode="json"), "owner": "alice"}))


async def leased(js, s, job: str, seq: int, epoch: int, executor: str) -> None:
    await publish(js, s.job_event(job, "leased"), JobEvent(job_id=job, seq=seq, event="leased",
                                                           state=JobState.RUNNING, epoch=epoch, executor_id=executor))


async def test_usage_sent_while_the_budget_was_down_longer_than_heartbeats_are_kept_is_charged(env):
    settings = env.settings(BudgetSettings)
    s = settings.subjects
    pg = await asyncpg.connect(env.database_url)
    async with jetstream(settings.nats_url) as (nc, js):
        async with running(serve, settings):  # creates the streams and the durables, then goes down
            pass
        hb, usage = s.stream_name("HB"), s.stream_name("USAGE")
        assert (await js.stream_info(usage)).config.max_age >= 14 * 86400 > (await js.stream_info(hb)).config.max_age
        # Stand in for "longer than the heartbeats' retention" (an hour): the heartbeat stream keeps 1 s here.
        config = (await js.stream_info(hb)).config
        config.max_age, config.duplicate_window = 1.0, 1.0
        await js.update_stream(config)

        await submitted(js, s, "j1", gpus=2)  # a grant of 2 devices: the records below claim 2
        await leased(js, s, "j1", 2, epoch=1, executor="ex1")
        # The same stretch, once in a heartbeat the way agents before usage reports carried it, once in a report.
        await publish(js, s.heartbeat("ex1"), Heartbeat(
            executor_id="ex1", node_id="n1", group="g", job_id="j1", epoch=1, phase=Phase.TRAINING,
            sent_at=datetime.now(UTC), interval_seconds=1, progress_interval_seconds=1,
            usage=UsageSample(job_id="j1", epoch=1, seq=1, devices=2, wall_seconds=3.0)))
        await publish(js, s.usage("ex1"), report("ex1", record("j1", 1, devices=2, wall=3.0),
                                                 record("j1", 2, devices=2, wall=1.5)))

        async def heartbeats_gone() -> bool:
            return (await js.stream_info(hb)).state.messages == 0

        await eventually(heartbeats_gone, 15)
        async with running(serve, settings):
            assert await eventually(lambda: _consumed(pg, "j1", 9.0), 15)
            rows = await pg.fetch("SELECT seq, gpu_seconds, started_at, ended_at FROM budget.ledger"
                                  " WHERE job_id = 'j1' ORDER BY seq")
            assert [(r["seq"], r["gpu_seconds"]) for r in rows] == [(1, 6.0), (2, 3.0)]
            assert rows[1]["ended_at"] - rows[1]["started_at"] == timedelta(seconds=1.5)
            (rec,) = await store.reconcile(pg, ["j1"])
            assert rec.ok and rec.rows == 2 and rec.ledger_seconds == 9.0
    await pg.close()


async def test_an_old_epoch_record_sent_again_after_a_partition_and_a_duplicate_are_each_charged_once(env):
    settings = env.settings(BudgetSettings)
    s = settings.subjects
    pg = await asyncpg.connect(env.database_url)
    async with running(serve, settings), jetstream(settings.nats_url) as (nc, js):
        await submitted(js, s, "j2", ceiling=100.0)
        await leased(js, s, "j2", 2, epoch=1, executor="ex1")
        await publish(js, s.usage("ex1"), report("ex1", record("j2", 1), record("j2", 2)))
        assert await eventually(lambda: _consumed(pg, "j2", 2.0))
        # ex1 is cut off; the queue moves the job to ex2 under epoch 2 while ex1's process runs on until it
        # notices (seq 3 and 4 of epoch 1, kept unsent in its backlog).
        await publish(js, s.job_event("j2", "lease_expired"), JobEvent(
            job_id="j2", seq=3, event="lease_expired", state=JobState.QUEUED, epoch=1))
        await leased(js, s, "j2", 4, epoch=2, executor="ex2")
        await eventually(lambda: pg.fetchval("SELECT epoch = 2 FROM budget.jobs WHERE job_id = 'j2'"))
        await publish(js, s.usage("ex2"), report("ex2", record("j2", 1, epoch=2, wall=10.0)))
        assert await eventually(lambda: _consumed(pg, "j2", 12.0))
        # The partition heals: ex1 sends its backlog; its first attempt did reach the server before the link
        # broke (no ack came back), so the retry is a second message with the same records.
        late = report("ex1", record("j2", 2), record("j2", 3), record("j2", 4, wall=2.5))
        await publish(js, s.usage("ex1"), late)
        await publish(js, s.usage("ex1"), late, msg_id=uuid.uuid4().hex)  # past JetStream's de-duplication
        await publish(js, s.usage("ex2"), report("ex2", record("j2", 1, epoch=2, wall=10.0)))  # a plain duplicate
        assert await eventually(lambda: _consumed(pg, "j2", 15.5))
        await publish(js, s.usage("ex2"), report("ex2", record("j2", 2, epoch=2, wall=0.5)))  # in order behind
        assert await eventually(lambda: _consumed(pg, "j2", 16.0))
        keys = await pg.fetch("SELECT executor_id, epoch, seq FROM budget.ledger WHERE job_id = 'j2' ORDER BY id")
        assert [tuple(k) for k in keys] == [("ex1", 1, 1), ("ex1", 1, 2), ("ex2", 2, 1), ("ex1", 1, 3),
                                            ("ex1", 1, 4), ("ex2", 2, 2)]
        (rec,) = await store.reconcile(pg, ["j2"])
        assert rec.ok and rec.rows == 6 and rec.consumed_seconds == 16.0 and rec.missing == 0
        # A record overtaken by a later one of its run shows as missing until it arrives.
        await publish(js, s.usage("ex2"), report("ex2", record("j2", 4, epoch=2, wall=0.5)))
        assert await eventually(lambda: _consumed(pg, "j2", 16.5))
        assert (await store.reconcile(pg, ["j2"]))[0].missing == 1
        await publish(js, s.usage("ex2"), report("ex2", record("j2", 3, epoch=2, wall=0.5)))
        assert await eventually(lambda: _consumed(pg, "j2", 17.0))
        (rec,) = await store.reconcile(pg, ["j2"])
        assert rec.ok and rec.missing == 0 and rec.open_runs == 2  # neither run's exit record was sent here
    await pg.close()


async def _consumed(pg: asyncpg.Connection, job: str, value: float) -> bool:
    return await pg.fetchval("SELECT consumed_seconds FROM budget.jobs WHERE job_id = $1", job) == value


distinct_records = st.lists(
    st.builds(lambda job, executor, epoch, seq, devices, wall: (executor, UsageRecord(
        job_id=job, epoch=epoch, seq=seq, devices=devices, wall_seconds=wall)),
        st.sampled_from(["a", "b"]), st.sampled_from(["ex1", "ex2"]), st.integers(1, 3), st.integers(1, 5),
        st.integers(1, 8), st.floats(0, 60, allow_nan=False)),
    min_size=1, max_size=20, unique_by=lambda p: (p[0], p[1].job_id, p[1].epoch, p[1].seq))


def test_the_store_charges_exactly_the_distinct_records_of_any_interleaving(env):
    """Property: duplicated, reordered and stale-epoch records, in batches, with the jobs' epochs moving on
    between batches, leave each job's total equal to the sum of its distinct records and to its ledger."""
    subjects = env.settings(BudgetSettings).subjects

    async def migrate() -> None:
        pool = await db.create_pool(env.database_url, max_size=2)
        await db.migrate(pool, store.SCHEMA, "services.budget")
        await pool.close()

    asyncio.run(migrate())

    @settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(distinct_records, st.randoms(use_true_random=False), st.integers(1, 6), st.lists(st.integers(1, 3)))
    def check(distinct, rnd, batch_size, epochs):
        run = uuid.uuid4().hex[:8]  # each example charges its own jobs
        distinct = [(e, r.model_copy(update={"job_id": f"{r.job_id}-{run}"})) for e, r in distinct]
        deliveries = [p for p in distinct for _ in range(rnd.randint(1, 3))]
        rnd.shuffle(deliveries)
        asyncio.run(_charge_all(env.database_url, subjects, deliveries, batch_size, epochs, run))
        asyncio.run(_assert_totals(env.database_url, distinct, run))

    check()


async def _charge_all(url: str, subjects, deliveries, batch_size: int, epochs: list[int], run: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for n in range(0, len(deliveries), batch_size):
            if epochs:  # a newer lease was granted meanwhile: what follows may be of an old epoch
                epoch = epochs[(n // batch_size) % len(epochs)]
                await conn.execute("UPDATE budget.jobs SET epoch = GREATEST(epoch, $1) WHERE job_id LIKE $2",
                                   epoch, f"%-{run}")
            batch = [store.charge_of(e, r) for e, r in deliveries[n:n + batch_size]]
            async with conn.transaction():
                await store.record_usage(conn, batch, subjects)
    finally:
        await conn.close()


async def _assert_totals(url: str, distinct, run: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        jobs = sorted({r.job_id for _, r in distinct})
        results = {r.job_id: r for r in await store.reconcile(conn, jobs)}
        for job in jobs:
            mine = [r for _, r in distinct if r.job_id == job]
            assert results[job].ok and results[job].rows == len(mine)
            assert results[job].consumed_seconds == pytest.approx(sum(r.devices * r.wall_seconds for r in mine))
    finally:
        await conn.close()


def test_teto_budget_reconcile_proves_each_total_and_names_a_job_whose_total_drifted(env, capsys):
    from teto.cli import main

    subjects = env.settings(BudgetSettings).subjects

    async def charge() -> None:
        pool = await db.create_pool(env.database_url, max_size=2)
        await db.migrate(pool, store.SCHEMA, "services.budget")
        async with pool.acquire() as conn, conn.transaction():
            await store.record_usage(conn, [store.charge_of("ex1", record(job, seq, devices=2, wall=0.1))
                                            for job in ("ja", "jb") for seq in (1, 2, 3)], subjects)
            await store.record_usage(conn, [store.charge_of("ex1", record("jc", seq)) for seq in (1, 3)], subjects)
        await pool.close()

    asyncio.run(charge())
    args = ["budget", "reconcile", "--database-url", env.database_url]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "3 job(s): every total equals the sum of its ledger" in out
    assert "usage records missing inside a run (in flight, or lost if it persists): jc (1)" in out

    async def drift() -> None:  # the account and its ledger disagree (a bug, or a hand edit of the total)
        conn = await asyncpg.connect(env.database_url)
        await conn.execute("UPDATE budget.jobs SET consumed_seconds = consumed_seconds + 0.5 WHERE job_id = 'jb'")
        await conn.close()

    asyncio.run(drift())
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "1 of 3 job(s) differ" in out and "jb" in out and "+0.5" in out and "ja" not in out
    assert main([*args, "--job", "ja", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["ok"] and [j["job_id"] for j in body["jobs"]] == ["ja"] and body["jobs"][0]["rows"] == 3


async def test_an_executor_cut_off_is_charged_for_every_second_its_process_ran_once_the_link_heals(env, tmp_path):
    """The real agent behind a severable link: its process runs on for most of a lease after the cut, the job
    moves to another executor under epoch 2, and once the link heals the old executor's backlog (epoch 1)
    is charged in full, once, next to the new run's usage; each job's total reconciles with its ledger."""
    from services.budget.app import serve as budget_serve
    from tests.support.fleet import death_of, fleet
    from tests.support.proxy import TcpProxy

    async with fleet(env, tmp_path / "fleet") as f, running(budget_serve, env.settings(BudgetSettings)):
        proxy = TcpProxy.to_url(f.nats_url).start()
        try:
            f.start_executor("cut", nats_url=proxy.url)
            await f.wait_executors("cut")
            job_id = await f.submit(f.spec("cut-off", steps=150, step_seconds=0.05, every=10))
            await f.wait_job(job_id, lambda j: j["state"] == "running" and j["executor_id"] == "cut", 30,
                             "running on the executor behind the proxy")
            f.start_executor("spare")
            await f.wait_executors("spare")
            await eventually(lambda: _rows(f.db, job_id, "cut"), 15, "some usage of the first run charged")
            (first,) = f.started(job_id)
            cut_at = datetime.now(UTC)
            assert proxy.cut() >= 1
            died_at = datetime.fromtimestamp(await death_of(first["pid"], timeout=15), UTC)
            await f.wait_job(job_id, lambda j: j["lease_epoch"] >= 2, 20, "redelivery under epoch 2")
            charged_before_heal = await _rows(f.db, job_id, "cut")
            proxy.restore()
            done = await f.wait_done(job_id, timeout=90)
            assert done["state"] == "succeeded" and done["executor_id"] == "spare", done

            async def first_run_complete() -> list | None:
                rows = await _rows(f.db, job_id, "cut")
                return rows if rows and rows[-1]["ended_at"] >= died_at - timedelta(seconds=1) else None

            rows = await eventually(first_run_complete, 20, "the cut-off run's usage up to its process's death")
            # Time used while cut off was held back, then charged: records ending after the cut, at epoch 1.
            assert {r["epoch"] for r in rows} == {1} and len(rows) > len(charged_before_heal)
            assert rows[-1]["ended_at"] > cut_at + timedelta(seconds=2)
            # One contiguous account of the process's life: no stretch missing, none counted twice.
            assert [r["seq"] for r in rows] == list(range(1, len(rows) + 1))
            span = (rows[-1]["ended_at"] - rows[0]["started_at"]).total_seconds()
            assert sum(r["wall_seconds"] for r in rows) == pytest.approx(span, abs=1e-3)
            # Both runs are closed (each one's record cut at its process's exit arrived) and have no gap.
            rec = await eventually(lambda: _closed(f.db, job_id), 15, "the second run's last usage record")
            assert rec.ok and rec.missing == 0 and rec.rows > len(rows)
        finally:
            proxy.close()


async def _closed(conn: asyncpg.Connection, job: str):
    (rec,) = await store.reconcile(conn, [job])
    return rec if rec.open_runs == 0 else None


async def _rows(conn: asyncpg.Connection, job: str, executor: str) -> list[asyncpg.Record]:
    return await conn.fetch("SELECT epoch, seq, wall_seconds, started_at, ended_at FROM budget.ledger"
                            " WHERE job_id = $1 AND executor_id = $2 ORDER BY epoch, seq", job, executor)


async def test_a_record_that_overtakes_its_grant_is_held_then_charged_when_the_grant_comes(env):
    settings = env.settings(BudgetSettings)
    s = settings.subjects
    pg = await asyncpg.connect(env.database_url)
    async with running(serve, settings), jetstream(settings.nats_url) as (nc, js):
        await submitted(js, s, "jh")
        await eventually(lambda: pg.fetchval("SELECT ceiling_seconds FROM budget.jobs WHERE job_id = 'jh'"))
        # The usage stream ran ahead of the job events: epoch 1's grant is not known yet.
        await publish(js, s.usage("ex1"), report("ex1", record("jh", 1, wall=2.0)))
        assert await eventually(lambda: pg.fetchval("SELECT count(*) = 1 FROM budget.held_usage WHERE job_id = 'jh'"))
        assert await pg.fetchval("SELECT consumed_seconds FROM budget.jobs WHERE job_id = 'jh'") == 0
        await leased(js, s, "jh", 2, epoch=1, executor="ex1")
        assert await eventually(lambda: _consumed(pg, "jh", 2.0))
        assert await pg.fetchval("SELECT count(*) FROM budget.held_usage") == 0
        (rec,) = await store.reconcile(pg, ["jh"])
        assert rec.ok and rec.rows == 1
    await pg.close()
