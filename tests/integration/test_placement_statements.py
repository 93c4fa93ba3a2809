"""What a placement pass asks PostgreSQL (issue 12, item 4): its grants are written together (one statement each
for the jobs, their events and the outbox, whatever the number of grants), each job's events still before its
own messages; the executors jobs hold are found by a join (a gang's every worker is busy, an executor two jobs
name is listed once); and the budget is asked only about jobs the pass considers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from bench._recording import Recording
from libs.contracts.commands import SubmitJob
from libs.contracts.jobs import JobSpec
from libs.runtime.service import Runtime
from services.queue import scans, store, tenancy_edge
from services.queue.commands import Commands
from services.queue.domain.wakes import FEWEST
from services.queue.scheduler import Scheduler
from services.queue.settings import QueueSettings
from services.queue.store import SCHEMA

pytestmark = pytest.mark.integration


async def _submit(rt: Runtime, settings: QueueSettings, n: int, workers: int = 1) -> list[str]:
    ids = []
    for _ in range(n):
        cmd = SubmitJob(actor="ann", spec=JobSpec(workload={"kind": "command", "command": ["true"]}, workers=workers))
        assert (await Commands(rt, settings).submit(cmd)).accepted
        ids.append(cmd.job_id)
    return ids


async def _executors(rt: Runtime, names: list[str]) -> None:
    await rt.pool.execute(
        "INSERT INTO queue.executors (executor_id, node_id, group_name, gpus, accepting, sent_at, last_seen)"
        " SELECT e, 'n-' || e, 'g', 0, true, clock_timestamp(), clock_timestamp() FROM unnest($1::text[]) AS e",
        names)
    await rt.pool.execute(
        "INSERT INTO queue.nodes (node_id, executor_id, group_name, state, schedulable, seq)"
        " SELECT 'n-' || e, e, 'g', 'ready', true, 1 FROM unnest($1::text[]) AS e", names)


async def _holding(rt: Runtime, job_id: str | None) -> None:
    """Executor ex-0's latest heartbeat names ``job_id`` (None: it holds none)."""
    await rt.pool.execute("UPDATE queue.executors SET job_id = $1 WHERE executor_id = 'ex-0'", job_id)


async def _waiting(rt: Runtime, job_id: str) -> object:
    return await rt.pool.fetchval("SELECT waiting FROM queue.jobs WHERE id = $1", job_id)


@contextlib.asynccontextmanager
async def _busy_fleet(env, interval: float) -> AsyncIterator[tuple[Runtime, QueueSettings, Scheduler]]:  # noqa: ANN001
    """The queue with one executor, ex-0, busy with another job, and its scheduler (placement tick ``interval``)."""
    settings = env.settings(QueueSettings).model_copy(update={"schedule_interval_seconds": interval})
    rt = await Runtime.open("queue", settings, schema=SCHEMA, package="services.queue")
    try:
        await _executors(rt, ["ex-0"])
        await _holding(rt, "elsewhere")
        yield rt, settings, Scheduler(rt, settings)
    finally:
        await rt.close()


async def test_a_pass_writes_its_grants_in_one_statement_each_and_each_jobs_events_precede_its_messages(env):
    settings = env.settings(QueueSettings)
    rt = await Runtime.open("queue", settings, schema=SCHEMA, package="services.queue")
    try:
        jobs = await _submit(rt, settings, 3)
        await _executors(rt, ["ex-0", "ex-1", "ex-2"])
        recording = Recording(rt.pool)
        placing = Runtime(rt.name, settings, recording, rt.nc, rt.js)  # type: ignore[arg-type]
        queued_before = await rt.pool.fetchval("SELECT count(*) FROM queue.outbox")
        assert await Scheduler(placing, settings).place_once() == 3
        writes = [(q.split(" SET ")[0].split("(")[0].strip(), n) for q, n in recording.calls
                  if q.startswith(("INSERT", "UPDATE"))]
        # Two statements for three grants (arrays, not a row each): the jobs' grant columns with the node
        # group and devices the quota counts (no second statement for those); then their events and their outbox
        # rows, together (store.events_statement).
        assert writes == [('UPDATE "queue".jobs j', 1)], recording.calls
        (together,) = [q for q, _ in recording.calls if q.startswith("WITH events AS")]
        assert 'INSERT INTO "queue".job_events' in together and 'INSERT INTO "queue".outbox' in together
        # Three rows a grant (its lease event, RunJob, LeaseEvent).
        assert await rt.pool.fetchval("SELECT count(*) FROM queue.outbox") == queued_before + 9
        held = await rt.pool.fetch("SELECT node_group, devices, waiting FROM queue.jobs WHERE id = ANY($1)", jobs)
        assert [(r["node_group"], r["devices"], r["waiting"]) for r in held] == [("g", 1, None)] * 3
        s = settings.subjects
        owner_of = {}  # outbox subject -> the job it belongs to
        for job_id in jobs:
            row = await rt.pool.fetchrow("SELECT state, event_seq, executor_id FROM queue.jobs WHERE id = $1", job_id)
            seqs = [r["seq"] for r in await rt.pool.fetch(
                "SELECT seq FROM queue.job_events WHERE job_id = $1 ORDER BY seq", job_id)]
            assert row["state"] == "running" and seqs == list(range(1, row["event_seq"] + 1))
            owner_of[s.job_event(job_id, "leased")] = (job_id, "event")
            owner_of[s.agent(row["executor_id"], "run")] = (job_id, "run")
        subjects = [r["subject"] for r in await rt.pool.fetch("SELECT subject FROM queue.outbox ORDER BY id")]
        order = [owner_of[x] for x in subjects if x in owner_of]
        # Each job's lease event, then its RunJob, job after job: the order three separate writes gave.
        assert sorted(order) == sorted(owner_of.values())
        assert [kind for _, kind in order] == ["event", "run"] * 3
        assert all(order[i][0] == order[i + 1][0] for i in range(0, 6, 2))
    finally:
        await rt.close()


async def test_every_worker_of_a_held_gang_is_busy_and_each_executor_is_listed_once(env):
    settings = env.settings(QueueSettings)
    rt = await Runtime.open("queue", settings, schema=SCHEMA, package="services.queue")
    try:
        await _executors(rt, ["ex-0", "ex-1", "ex-2", "ex-3"])
        (gang, other) = await _submit(rt, settings, 2)
        # A forming gang on ex-0 and ex-1 (ex-1's heartbeat does not name it yet); a stale row naming ex-1 too.
        await rt.pool.execute("UPDATE queue.jobs SET state = 'admitting', workers = '{ex-0,ex-1}' WHERE id = $1",
                              gang)
        await rt.pool.execute("UPDATE queue.jobs SET state = 'running', workers = '{ex-1}' WHERE id = $1", other)
        await rt.pool.execute("UPDATE queue.executors SET accepting = false WHERE executor_id = 'ex-3'")
        async with rt.pool.acquire() as conn:
            now = await store.db_now(conn)
            nodes = await tenancy_edge.schedulable_nodes(conn, now, 60.0)
        assert [(n.executor_id, n.free) for n in nodes] == [("ex-0", False), ("ex-1", False), ("ex-2", True),
                                                            ("ex-3", False)]
        async with rt.pool.acquire() as conn:  # the placement pass's first question agrees: ex-2 is free
            assert await scans.queued_and_free(conn, 60.0) == (False, True)
            await conn.execute("UPDATE queue.executors SET job_id = 'other' WHERE executor_id = 'ex-2'")
            assert await scans.queued_and_free(conn, 60.0) == (False, False)
            await conn.execute("UPDATE queue.executors SET job_id = NULL, last_seen = last_seen - interval '2 min'"
                               " WHERE executor_id = 'ex-2'")
            assert await scans.queued_and_free(conn, 60.0) == (False, False)  # silent too long
    finally:
        await rt.close()


async def test_only_jobs_within_the_pass_are_asked_about_their_consumption(env):
    settings = env.settings(QueueSettings)
    rt = await Runtime.open("queue", settings, schema=SCHEMA, package="services.queue")
    try:
        first, second, third = await _submit(rt, settings, 3)
        await rt.pool.execute("UPDATE queue.jobs SET lease_epoch = 1 WHERE id = ANY($1::text[])", [first, third])
        await rt.pool.execute("UPDATE queue.jobs SET created_at = created_at + $2 WHERE id = $1", third,
                              timedelta(minutes=5))
        async with rt.pool.acquire() as conn:
            orgs = await tenancy_edge.organisations(conn)
            two = await tenancy_edge.candidates(conn, orgs, 2)  # what a pass of max_jobs_per_pass=2 considers
            assert sorted(two) == sorted([first, second])
            assert [j.id for j in await scans.queued_jobs_placed_before(conn, two)] == [first]
            three = await tenancy_edge.candidates(conn, orgs, 3)
            assert [j.id for j in await scans.queued_jobs_placed_before(conn, three)] == [first, third]
    finally:
        await rt.close()


async def test_candidates_read_per_organisation_are_the_choice_over_every_queued_job(env):
    """The candidates' query reads at most ``limit`` jobs of each organisation (an index per organisation, no
    scan of every queued row) and makes the choice itself; it must be the one ``tenancy.candidates.choose``
    makes over them all, with the devices each organisation holds and the organisations' weights."""
    from libs.contracts.tenancy import OrgSpec
    from services.queue.tenancy.candidates import Candidate, choose
    from services.queue.tenancy.model import devices

    settings = env.settings(QueueSettings)
    rt = await Runtime.open("queue", settings, schema=SCHEMA, package="services.queue")
    try:
        await _submit(rt, settings, 12)
        ids = [r["id"] for r in await rt.pool.fetch("SELECT id FROM queue.jobs ORDER BY created_at, id")]
        shape = {ids[0]: ("a", 5, 1, 0), ids[1]: ("a", 0, 1, 8), ids[2]: ("a", 5, 2, 1), ids[3]: ("a", -2, 1, 0),
                 ids[4]: ("b", 0, 1, 1), ids[5]: ("b", 9, 4, 8), ids[6]: ("c", 0, 1, 0), ids[7]: ("a", 0, 1, 1),
                 ids[8]: ("b", 0, 1, 0), ids[9]: ("c", 0, 1, 8), ids[10]: ("c", 0, 1, 0), ids[11]: ("b", 0, 1, 0)}
        await rt.pool.executemany(
            "UPDATE queue.jobs SET org = $2, priority = $3,"
            " spec = spec || jsonb_build_object('workers', $4::int, 'gpus_per_worker', $5::int) WHERE id = $1",
            [(i, o, p, w, g) for i, (o, p, w, g) in shape.items()])
        # b is weighted 3; c holds 9 devices with a running job, a none with its.
        await rt.pool.execute("INSERT INTO queue.orgs (name, spec, updated_by, updated_at) VALUES"
                              " ('b', $1::jsonb, 't', now())", OrgSpec(weight=3.0).model_dump_json())
        await rt.pool.execute("UPDATE queue.jobs SET state = 'running', org = 'c', devices = 9 WHERE id = $1",
                              ids[10])
        await rt.pool.execute("UPDATE queue.jobs SET state = 'running', org = 'a', devices = 0 WHERE id = $1",
                              ids[11])
        async with rt.pool.acquire() as conn:
            orgs = await tenancy_edge.organisations(conn)
            rows = await conn.fetch("SELECT id, org, created_at, priority, spec FROM queue.jobs"
                                    " WHERE state = 'queued'")
            every = [Candidate(r["id"], r["org"], r["created_at"], r["priority"],
                               devices(shape[r["id"]][2], shape[r["id"]][3])) for r in rows]
            for limit in (1, 2, 3, 4, 6, 9, 20):
                got = await tenancy_edge.candidates(conn, orgs, limit)
                want = choose(every, limit, {"c": 9}, {n: o.weight for n, o in orgs.items()})
                assert got == want, limit  # the same jobs, in the same order of share deficit
            plan = "\n".join(r[0] for r in await conn.fetch("EXPLAIN " + tenancy_edge.CANDIDATES, 3, [], []))
            assert "jobs_queued_org" in plan
    finally:
        await rt.close()


async def test_a_pass_with_no_free_executor_is_made_whole_once_a_tick(env):
    """Wakes onto a busy fleet (a burst of submits) cost one query each: a pass with jobs queued and no executor
    free is made whole (waiting reasons written) only once a placement tick has passed since the last whole one."""
    async with _busy_fleet(env, 1.0) as (rt, settings, scheduler):
        (first,) = await _submit(rt, settings, 1)
        assert await scheduler.place_once() == 0 and scheduler.skipped == 0  # the first pass is whole
        assert await _waiting(rt, first) is not None
        (second,) = await _submit(rt, settings, 1)
        assert await scheduler.place_once() == 0 and scheduler.skipped == 1  # woken at once: one query
        assert await _waiting(rt, second) is None
        await asyncio.sleep(1.1)
        assert await scheduler.place_once() == 0 and scheduler.skipped == 1  # a tick later: whole again
        assert await _waiting(rt, second) is not None
        await _holding(rt, None)
        assert await scheduler.place_once() == 1  # an executor free: at once, and granted


async def test_a_pass_for_one_free_executor_considers_the_first_jobs_by_share_not_the_whole_queue(env):
    """Between whole passes (once a tick), an executor freed gets a pass sized to the free executors
    (``domain/wakes.pass_size``): the job granted is the one a whole pass would grant first, and jobs beyond
    the sized pass's candidates are not planned (their waiting reasons wait for the next whole pass)."""
    async with _busy_fleet(env, 60.0) as (rt, settings, scheduler):
        jobs = await _submit(rt, settings, FEWEST + 4)
        assert await scheduler.place_once() == 0  # the first pass is whole: every job's reason written
        assert all([await _waiting(rt, j) is not None for j in jobs])
        (late,) = await _submit(rt, settings, 1)
        await _holding(rt, None)
        recording = Recording(rt.pool)
        placing = Scheduler(Runtime(rt.name, settings, recording, rt.nc, rt.js), settings)  # type: ignore[arg-type]
        placing._whole_at = scheduler._whole_at  # the same loop, a moment after its whole pass
        assert await placing.place_once() == 1 and placing.widened == 0
        assert await rt.pool.fetchval("SELECT state FROM queue.jobs WHERE id = $1", jobs[0]) == "running"
        assert await _waiting(rt, late) is None  # beyond the sized pass: not planned
        (candidates,) = [args for q, args in recording.statements if "queued_orgs" in q]
        assert candidates[0] == FEWEST  # the pass asked for FEWEST candidates, not max_jobs_per_pass


async def test_a_sized_pass_whose_jobs_cannot_use_the_free_executor_is_widened_to_a_whole_one_at_once(env):
    """The first jobs by share are gangs of two and one executor is free: the sized pass grants nothing, so a
    whole pass follows at once and grants the single job queued behind them (gang backfill, as before)."""
    async with _busy_fleet(env, 60.0) as (rt, settings, scheduler):
        await _submit(rt, settings, FEWEST + 2, workers=2)
        (single,) = await _submit(rt, settings, 1)
        assert await scheduler.place_once() == 0  # whole, nothing free
        await _holding(rt, None)
        assert await scheduler.place_once() == 1 and scheduler.widened == 1
        assert await rt.pool.fetchval("SELECT state FROM queue.jobs WHERE id = $1", single) == "running"
