"""The budget's usage batch (services/budget/store.py ``record_usage``): its rows travel as one JSON parameter
and are inserted before the ledger is read, which is read back only for records already charged (a redelivery).
Against real PostgreSQL, over random batches with redeliveries, conflicting figures, records of old epochs and
ceilings crossed: every figure lands in the ledger exactly (floats and times round-trip), each identity is
charged once, the counts are those of planning the batch against the ledger first (``plan_charges``, as the
service did before), and charging the same deliveries one record per transaction ends with the same accounts."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone

import asyncpg
import pytest

from services.budget import store
from services.budget.domain.usage import Charge, plan_charges
from services.budget.settings import BudgetSettings
from tests.integration.helpers_sql import migrated, statements

pytestmark = pytest.mark.integration

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
JOBS = ["a", "b", "c"]


def deliveries(rng: random.Random, n: int) -> list[Charge]:
    """Records of a few runs, each identity with one set of figures; some delivered again, a few re-sent with
    other figures (a sender's breach: the first stays charged)."""
    out: list[Charge] = []
    for _ in range(n):
        job, ex, epoch, seq = rng.choice(JOBS), rng.choice(["ex1", "ex2"]), rng.randint(1, 3), rng.randint(1, 8)
        devices = 1 + (seq % 3)  # the figures follow from the identity: a redelivery is identical
        wall = 0.25 * (seq + epoch) + 1 / 3  # not exact in binary: proves the float round trip
        start = (T0 + timedelta(seconds=seq * 30, microseconds=123_457 * epoch)).astimezone(
            timezone(timedelta(hours=epoch - 2)))  # any offset: the instant is what lands
        c = Charge(job, ex, epoch, seq, devices, wall, start, start + timedelta(seconds=wall), rng.random() < 0.2)
        if rng.random() < 0.1:
            c = Charge(c.job_id, c.executor_id, c.epoch, c.seq, c.devices + 1, c.wall_seconds)  # conflicting
        out.append(c)
    return out


async def ledger_of(conn: asyncpg.Connection, suffix: str) -> dict[tuple, Charge]:
    rows = await conn.fetch("SELECT * FROM budget.ledger WHERE job_id LIKE $1", f"%{suffix}")
    return {(r["job_id"], r["executor_id"], r["epoch"], r["seq"]): Charge(
        r["job_id"], r["executor_id"], r["epoch"], r["seq"], r["devices"], r["wall_seconds"], r["started_at"],
        r["ended_at"], r["last"]) for r in rows}


async def accounts(conn: asyncpg.Connection, suffix: str) -> list[tuple]:
    rows = await conn.fetch("SELECT job_id, consumed_seconds, exhausted_for_ceiling, overshoot_seconds, epoch"
                            " FROM budget.jobs WHERE job_id LIKE $1 ORDER BY job_id", f"%{suffix}")
    return [(r["job_id"][:-len(suffix)], pytest.approx(r["consumed_seconds"], rel=1e-12), r["exhausted_for_ceiling"],
             pytest.approx(r["overshoot_seconds"], rel=1e-12, abs=1e-9), r["epoch"]) for r in rows]


def unsuffixed(ledger: dict[tuple, Charge], suffix: str) -> dict[tuple, tuple]:
    return {(k[0][:-len(suffix)], *k[1:]): (v.devices, v.wall_seconds, v.started_at, v.ended_at, v.last)
            for k, v in ledger.items()}


def renamed(batch: list[Charge], suffix: str) -> list[Charge]:
    return [Charge(c.job_id + suffix, c.executor_id, c.epoch, c.seq, c.devices, c.wall_seconds, c.started_at,
                   c.ended_at, c.last) for c in batch]


async def test_random_batches_charge_each_record_once_with_the_counts_of_planning_first(env):
    rng = random.Random(1313)
    async with migrated(env, BudgetSettings, store.SCHEMA, "services.budget") as (settings, conn):
        s = settings.subjects
        for suffix in ("-batch", "-one"):  # ceilings low enough that random batches cross them
            await conn.execute("INSERT INTO budget.jobs (job_id, ceiling_seconds) SELECT unnest($1::text[]), 40",
                               [j + suffix for j in JOBS])
        announced: dict[str, list[str]] = {"-batch": [], "-one": []}
        for _ in range(30):
            sent_out = deliveries(rng, rng.randint(1, 12))
            batch = renamed(sent_out, "-batch")
            if rng.random() < 0.3:  # a newer lease meanwhile: records of older epochs are late
                await conn.execute("UPDATE budget.jobs SET epoch = GREATEST(epoch, $1)", rng.randint(1, 3))
            before = await ledger_of(conn, "-batch")
            epochs = {r["job_id"]: r["epoch"] for r in await conn.fetch("SELECT job_id, epoch FROM budget.jobs")}
            expected = plan_charges(batch, {c.key: before[c.key] for c in batch if c.key in before}, epochs)
            with statements(conn, "budget.") as sent:
                async with conn.transaction():
                    effects = await store.record_usage(conn, batch, s)
            assert (effects.inserted, effects.late, effects.duplicates) == \
                (len(expected.fresh), expected.late, expected.duplicates)
            assert effects.charged == pytest.approx(sum(c.gpu_seconds for c in expected.fresh))
            after = await ledger_of(conn, "-batch")
            assert {k: v for k, v in after.items() if k not in before} == {c.key: c for c in expected.fresh}
            # lock (1: the jobs are known), then the insert with the accounts it makes (one statement); only when
            # some record was charged before: the ledger read, and the accounts of the rows that landed (if any)
            redelivered = any(c.key in before for c in batch)
            assert len(sent) == 2 + redelivered * (1 + bool(expected.fresh)), sent
            announced["-batch"] += [subj for subj, _ in effects.events]
            for c in renamed(sent_out, "-one"):  # the same deliveries, a record per transaction
                async with conn.transaction():
                    announced["-one"] += [subj for subj, _ in (await store.record_usage(conn, [c], s)).events]
        assert await accounts(conn, "-batch") == await accounts(conn, "-one")
        assert unsuffixed(await ledger_of(conn, "-batch"), "-batch") == unsuffixed(await ledger_of(conn, "-one"), "-one")
        assert sorted(x.replace("-batch", "") for x in announced["-batch"]) == \
            sorted(x.replace("-one", "") for x in announced["-one"])
        assert announced["-batch"], "no ceiling crossed: the test proves less than it says"
        for result in await store.reconcile(conn):
            assert result.ok, result


async def test_a_redelivered_batch_charges_nothing_again(env):
    async with migrated(env, BudgetSettings, store.SCHEMA, "services.budget") as (settings, conn):
        batch = renamed(deliveries(random.Random(7), 20), "-r")
        async with conn.transaction():
            first = await store.record_usage(conn, batch, settings.subjects)
        consumed = await conn.fetchval("SELECT sum(consumed_seconds) FROM budget.jobs")
        async with conn.transaction():
            again = await store.record_usage(conn, batch, settings.subjects)
        assert first.inserted > 0 and again.inserted == 0 and again.charged == 0 and again.events == []
        assert again.duplicates == first.inserted + first.duplicates
        assert await conn.fetchval("SELECT sum(consumed_seconds) FROM budget.jobs") == consumed


async def test_every_instant_lands_exactly_near_and_far_from_1970(env):
    """Times travel as whole microseconds since 1970 (``store.micros``), or as text beyond 2**53 of them: either
    way the instant stored is the one sent, to the microsecond, whatever its offset (naive: the machine's time)."""
    far = [datetime(1, 1, 1, 0, 0, 0, 1, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
           datetime(1685, 1, 1, 0, 0, 0, 3, tzinfo=UTC), datetime(2255, 1, 1, 0, 0, 0, 999_999, tzinfo=UTC)]
    near = [datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC), datetime(1970, 1, 1, tzinfo=UTC),
            datetime(2026, 12, 1, 12, 0, 0, 123_457, tzinfo=timezone(timedelta(hours=-9, minutes=-30))),
            datetime(2026, 12, 1, 12, 0, 0, 654_321)]  # naive
    sent = far + near
    batch = [Charge("t", "ex1", 1, i + 1, 1, 1.0, at, at, False) for i, at in enumerate(sent)]
    async with migrated(env, BudgetSettings, store.SCHEMA, "services.budget") as (settings, conn):
        async with conn.transaction():
            effects = await store.record_usage(conn, batch, settings.subjects)
        got = {r["seq"]: (r["started_at"], r["ended_at"])
               for r in await conn.fetch("SELECT seq, started_at, ended_at FROM budget.ledger")}
    assert effects.inserted == len(sent)
    for i, at in enumerate(sent):
        instant = at if at.tzinfo is not None else at.astimezone(UTC)
        assert got[i + 1] == (instant, instant), (at, got[i + 1])
    assert [type(store.micros(at)) for at in far] == [str] * 2 + [int] * 2  # both paths were taken
    assert {type(store.micros(at)) for at in near} == {int}


async def test_a_batch_with_a_record_charged_before_charges_only_the_new_ones(env):
    """The accounts written with the insert are decided as if every record were new; when one was charged before,
    that statement writes no account and the accounts of the rows that did land are written after, once."""
    async with migrated(env, BudgetSettings, store.SCHEMA, "services.budget") as (settings, conn):
        await conn.execute("INSERT INTO budget.jobs (job_id, ceiling_seconds) VALUES ('k', 10)")
        first, second = (Charge("k", "ex1", 1, seq, 2, 3.0) for seq in (1, 2))
        async with conn.transaction():
            await store.record_usage(conn, [first], settings.subjects)
        with statements(conn, "budget.") as sent:
            async with conn.transaction():
                effects = await store.record_usage(conn, [first, second, Charge("k", "ex1", 1, 3, 2, 3.0)],
                                                   settings.subjects)
        assert (effects.inserted, effects.duplicates, effects.charged) == (2, 1, 12.0)
        assert [e.split(".")[-1] for e, _ in effects.events] == ["exhausted"]  # 18 of 10: announced once
        assert len(sent) == 4  # lock, insert (no account written), the ledger read, the accounts
        assert await conn.fetchval("SELECT consumed_seconds FROM budget.jobs WHERE job_id = 'k'") == 18.0
        assert await conn.fetchval("SELECT count(*) FROM budget.ledger") == 3


async def test_the_ledger_keeps_one_index_for_a_jobs_rows(env):
    """An appended row updates the primary key's index and the identity's; a job's or a run's rows are read
    through the identity's index (its leading columns), so no third index is kept (migration 006)."""
    async with migrated(env, BudgetSettings, store.SCHEMA, "services.budget") as (_, conn):
        indexes = {r["indexdef"].split(" USING ")[1] for r in await conn.fetch(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = 'budget' AND tablename = 'ledger'")}
        assert indexes == {"btree (id)", "btree (job_id, epoch, executor_id, seq)"}
        await conn.execute("SET enable_seqscan = off")
        plan = "\n".join(r[0] for r in await conn.fetch(
            "EXPLAIN SELECT * FROM budget.usage_public WHERE job_id = 'j' AND epoch = 2"))
        assert "ledger_job_id_epoch_executor_id_seq_key" in plan, plan
