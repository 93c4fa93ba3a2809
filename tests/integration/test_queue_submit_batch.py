"""A fetched batch of submits decided in one queue transaction (services/queue/submits.py), against real
PostgreSQL and NATS: refusals among acceptances, a redelivered command (from an earlier batch, and twice in the
same batch) answered with its stored outcome, a batch whose transaction fails applied one message at a time by
the edge (the poison one dead-lettered), and the round trips a batch costs not growing with its size."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest

from libs.contracts.commands import SetOrganisation, SubmitJob
from libs.contracts.policies import GangPolicy
from libs.contracts.subjects import Subjects
from libs.contracts.tenancy import OrgSpec
from libs.runtime.edge_loop import ConsumerLoop
from libs.runtime.edge_stream import EdgeBroker, provide, subscribe
from libs.runtime.fencing import StaleCounter
from libs.runtime.service import Runtime
from libs.runtime.unit import Units
from services.queue import policy, submits
from services.queue.commands import Commands
from services.queue.handlers import consumers
from services.queue.settings import QueueSettings
from services.queue.store import SCHEMA
from services.queue.tenancy_edge import Tenancy
from tests.support import builders
from tests.support.countingdb import CountingPool
from tests.support.edgefakes import FakeMsg, FakeReporter, started

pytestmark = pytest.mark.integration


def submit(name: str, **kw) -> SubmitJob:
    return builders.submit(builders.spec(name=name, **kw.pop("spec", {})), **kw)


async def outcome_rows(pool: asyncpg.Pool, settings: QueueSettings, command_id: str) -> list[dict]:
    rows = await pool.fetch(f"SELECT payload FROM {SCHEMA}.outbox WHERE subject = $1 ORDER BY id",
                            settings.subjects.outcome("submit", command_id))
    return [json.loads(bytes(r["payload"])) for r in rows]


async def open_queue(env) -> tuple[QueueSettings, Runtime]:
    settings = env.settings(QueueSettings)
    return settings, await Runtime.open("queue", settings, schema=SCHEMA, package="services.queue")


async def test_refused_submits_among_accepted_ones_refuse_only_themselves(env):
    settings, runtime = await open_queue(env)
    try:
        commands = Commands(runtime, settings)
        async with commands.units.begin() as unit:
            await policy.save(unit.conn, GangPolicy(ready_timeout_seconds=60), "admin", runtime.clock.now())
        batch = [submit("ok-1"), submit("no-org", org="ghost"), submit("ok-2"),
                 submit("too-patient", spec={"ready_timeout_seconds": 600}), submit("no-project", spec={"project": "x"}),
                 submit("ok-3", spec={"ready_timeout_seconds": 30})]
        outcomes = await commands.submit_all(batch)
        assert [o.command_id for o in outcomes] == [c.command_id for c in batch]
        assert [o.accepted for o in outcomes] == [True, False, True, False, False, True]
        assert outcomes[1].reason == "organisation ghost does not exist"
        assert "longer than the gang policy's 60" in outcomes[3].reason
        assert outcomes[3].detail == {"ready_timeout_seconds": 600, "policy_ready_timeout_seconds": 60}
        assert outcomes[4].reason == "project x does not exist in organisation default"
        jobs = {r["id"]: r["state"] for r in await runtime.pool.fetch(f"SELECT id, state FROM {SCHEMA}.jobs")}
        assert jobs == {batch[i].job_id: "queued" for i in (0, 2, 5)}
        events = await runtime.pool.fetch(f"SELECT job_id, seq, event FROM {SCHEMA}.job_events ORDER BY job_id")
        assert sorted((e["job_id"], e["seq"], e["event"]) for e in events) == sorted(
            (batch[i].job_id, 1, "submitted") for i in (0, 2, 5))
        for cmd, outcome in zip(batch, outcomes, strict=True):  # each answered once, through the outbox
            (published,) = await outcome_rows(runtime.pool, settings, cmd.command_id)
            assert published["accepted"] == outcome.accepted and published["reason"] == outcome.reason
            stored = await runtime.pool.fetchval(f"SELECT outcome FROM {SCHEMA}.processed_commands"
                                                 " WHERE command_id = $1", cmd.command_id)
            assert json.loads(stored)["accepted"] == outcome.accepted
        # An organisation created afterwards lets the same spec in under a new command id.
        await Tenancy(runtime).set_org(SetOrganisation(actor="root", name="ghost", spec=OrgSpec()))
        assert (await commands.submit(submit("no-org-now", org="ghost"))).accepted
    finally:
        await runtime.close()


async def test_a_redelivered_submit_in_a_batch_is_answered_with_its_stored_outcome_and_acts_once(env):
    settings, runtime = await open_queue(env)
    try:
        commands = Commands(runtime, settings)
        earlier, refused = submit("earlier"), submit("refused", org="ghost")
        assert [o.accepted for o in await commands.submit_all([earlier, refused])] == [True, False]
        fresh = submit("fresh")
        # The earlier two redelivered beside a new submit that itself comes twice in the batch.
        outcomes = await commands.submit_all([earlier, fresh, refused, fresh])
        assert [o.accepted for o in outcomes] == [True, True, False, True]
        assert outcomes[2].reason == "organisation ghost does not exist"
        assert outcomes[1] == outcomes[3] and outcomes[0].job_id == earlier.job_id
        assert await runtime.pool.fetchval(f"SELECT count(*) FROM {SCHEMA}.jobs") == 2
        assert await runtime.pool.fetchval(f"SELECT count(*) FROM {SCHEMA}.job_events") == 2  # one submitted each
        for cmd, answers in ((earlier, 2), (refused, 2), (fresh, 2)):  # a new message for every delivery
            published = await outcome_rows(runtime.pool, settings, cmd.command_id)
            assert len(published) == answers and len({p["id"] for p in published}) == answers
            assert len({(p["accepted"], p["reason"], p["job_id"]) for p in published}) == 1
    finally:
        await runtime.close()


async def test_a_batch_whose_transaction_fails_is_decided_one_by_one_and_the_poison_is_dead_lettered(env,
                                                                                                     monkeypatch):
    settings, runtime = await open_queue(env)
    try:
        commands = Commands(runtime, settings)
        write = submits.store.write_staged

        async def poisoned(conn, subjects, staged, **kw):
            if any(s.job.name == "poison" for s in staged):
                raise asyncpg.DataError("invalid input: the poisoned submit")
            await write(conn, subjects, staged, **kw)

        monkeypatch.setattr(submits.store, "write_staged", poisoned)
        consumer = next(c for c in consumers(runtime.subjects) if c.durable == "queue-submit")
        reporter = FakeReporter()
        edge = ConsumerLoop(js=None, subjects=Subjects(), consumer=consumer, reporter=reporter)  # type: ignore[arg-type]
        broker = EdgeBroker()  # declared as the runtime declares it: the handler finds ``commands`` in its context
        started(broker, subscribe(broker, runtime.subjects, consumer, edge))
        provide(broker, commands=commands)
        batch = [submit("good-1"), submit("poison"), submit("good-2")]
        msgs = [FakeMsg(c.encode(), subject=settings.subjects.cmd("submit"), seq=i) for i, c in enumerate(batch, 1)]
        await edge.settle(msgs)
        assert edge.counters.isolated_batches == 1 and [m.outcome for m in msgs] == ["ack", "ack", "ack"]
        (letter,) = reporter.buried
        assert letter.payload == batch[1].encode() and "poisoned submit" in letter.reason
        jobs = {r["name"] for r in await runtime.pool.fetch(f"SELECT name FROM {SCHEMA}.jobs")}
        assert jobs == {"good-1", "good-2"}
        # Nothing of the failed batch was kept: each good submit was claimed and answered exactly once.
        for cmd in (batch[0], batch[2]):
            assert len(await outcome_rows(runtime.pool, settings, cmd.command_id)) == 1
        assert await outcome_rows(runtime.pool, settings, batch[1].command_id) == []
        assert not await runtime.pool.fetchval(f"SELECT count(*) FROM {SCHEMA}.processed_commands"
                                               " WHERE command_id = $1", batch[1].command_id)
    finally:
        await runtime.close()


async def test_the_round_trips_of_a_batch_do_not_grow_with_its_size(env):
    from tests.support.spans import kept_spans

    settings, runtime = await open_queue(env)
    # Traced, as a deployment that exports traces is (and as every later test of a process in which one test
    # installed a tracer provider is): each submit's trace context is then remembered for its job's grants.
    try:
        counting = CountingPool(runtime.pool)
        commands = Commands(runtime, settings, Units(counting, SCHEMA, runtime.subjects, StaleCounter("queue")))
        trips = {}
        with kept_spans():
            for size in (1, 5, 50):
                counting.reset()
                outcomes = await commands.submit_all([submit(f"n{size}-{i}") for i in range(size)])
                assert all(o.accepted for o in outcomes)
                trips[size] = counting.counts["round_trips"]
            # BEGIN, claims, tenancy, jobs locked, jobs, events with the outbox and the wake-up, traces, outcomes
            # recorded, COMMIT.
            assert trips == {1: 9, 5: 9, 50: 9}
            counting.reset()  # with a refusal: its answer is one more statement (refusals' answers, all together)
            await commands.submit_all([submit("again-1", command_id="n5x"), submit("ghost", org="ghost")])
            refused = counting.counts["round_trips"]
            counting.reset()  # a repeat alone: BEGIN, claim, its stored outcome, its answer, COMMIT
            await commands.submit_all([submit("again-1", command_id="n5x")])
            assert counting.counts["round_trips"] == 5, counting.counts
        assert refused == 10
    finally:
        await runtime.close()


async def test_each_submit_of_a_batch_continues_its_own_senders_trace(env):
    from tests.support.spans import kept_spans

    settings, runtime = await open_queue(env)
    try:
        commands = Commands(runtime, settings)
        traced = [submit(f"traced-{i}") for i in range(3)]
        parents = [f"00-{i + 1:032x}-{i + 1:016x}-01" for i in range(3)]
        for cmd, parent in zip(traced, parents, strict=True):
            cmd.note_trace({"traceparent": parent})
        with kept_spans() as spans:
            await commands.submit_all(traced)
        submits_ = [s for s in spans.get_finished_spans() if s.name == "queue submit"]
        assert sorted(s.context.trace_id for s in submits_) == [1, 2, 3]
        for cmd, parent in zip(traced, parents, strict=True):
            trace_id = parent.split("-")[1]
            (published,) = await runtime.pool.fetch(f"SELECT headers FROM {SCHEMA}.outbox WHERE subject = $1",
                                                    settings.subjects.outcome("submit", cmd.command_id))
            assert json.loads(published["headers"])["traceparent"].split("-")[1] == trace_id
            kept = await runtime.pool.fetchval(f"SELECT traceparent FROM {SCHEMA}.job_traces WHERE job_id = $1",
                                               cmd.job_id)
            assert kept.split("-")[1] == trace_id  # the job's grants will continue the submit's trace
    finally:
        await runtime.close()


async def test_two_replicas_deciding_the_same_submits_in_opposite_orders_decide_each_once(env, monkeypatch):
    """Claims are taken in command-id order whatever the batch's order, so two replicas claiming overlapping
    batches wait on each other's commit instead of deadlocking (checked on the claims each replica sent)."""
    settings = env.settings(QueueSettings)
    replicas = [await Runtime.open("queue", settings, schema=SCHEMA, package="services.queue") for _ in range(2)]
    claim_many, sent = submits.once.claim_many, []

    async def spy(conn, schema, claims):
        sent.append([c for c, _ in claims])
        return await claim_many(conn, schema, claims)

    monkeypatch.setattr(submits.once, "claim_many", spy)
    try:
        batch = [submit(f"raced-{i}") for i in range(20)]
        first, second = await asyncio.gather(Commands(replicas[0], settings).submit_all(batch),
                                             Commands(replicas[1], settings).submit_all(batch[::-1]))
        assert all(o.accepted for o in first + second)
        assert await replicas[0].pool.fetchval(f"SELECT count(*) FROM {SCHEMA}.jobs") == 20
        assert await replicas[0].pool.fetchval(f"SELECT count(*) FROM {SCHEMA}.job_events") == 20
        assert sent == [sorted(c.command_id for c in batch)] * 2
    finally:
        for r in replicas:
            await r.close()
