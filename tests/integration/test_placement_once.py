"""A placement pass chooses its candidates once, under the placement lock (issue 12, item 4): the budget is asked
about exactly those, before any row is locked; a chosen job that leaves the queue while the budget answers is
not granted; another replica's pass waits for the lock and only then chooses, on what the first committed (no
choice made before the lock is ever granted from, no job granted twice). And the statements of a pass, counted,
so that one more shows."""

from __future__ import annotations

import asyncio

import pytest

from bench._recording import Recording
from bench.bench_placement import _Reply
from libs.contracts.agents import RunJob
from libs.contracts.budget import BudgetStatusReply, BudgetStatusRequest, OrgBudgetReply, OrgBudgetRequest
from libs.runtime.service import Runtime
from services.queue.scheduler import Scheduler
from services.queue.settings import QueueSettings
from services.queue.store import SCHEMA
from tests.integration.test_placement_statements import _executors, _submit
from tests.support.services import eventually

pytestmark = pytest.mark.integration

CHOICE = "WITH RECURSIVE queued_orgs"
LOCK = "pg_advisory_xact_lock"


class SlowBudget:
    """The budget service's two questions, answered only once the test says so (consumed: 10 GPU-seconds)."""

    def __init__(self, settings: QueueSettings) -> None:
        self.subjects = settings.subjects
        self.asked_about: list[str] = []
        self.asked = asyncio.Event()
        self.release = asyncio.Event()

    async def request(self, subject: str, payload: bytes, timeout: float) -> _Reply:  # noqa: ARG002
        self.asked.set()
        await self.release.wait()
        if subject == self.subjects.rpc_budget_status:
            req = BudgetStatusRequest.decode(payload)
            self.asked_about.append(req.job_id)
            return _Reply(BudgetStatusReply(job_id=req.job_id, known=True, consumed_seconds=10.0).encode())
        req = OrgBudgetRequest.decode(payload)
        return _Reply(OrgBudgetReply(org_consumed={o: 0.0 for o in req.orgs},
                                     job_consumed={j: 10.0 for j in req.jobs}).encode())


async def test_a_pass_chooses_once_after_the_lock_in_a_counted_number_of_statements(env):
    settings = env.settings(QueueSettings)
    rt = await Runtime.open("queue", settings, schema=SCHEMA, package="services.queue")
    try:
        await _submit(rt, settings, 3)
        await _executors(rt, ["ex-0", "ex-1", "ex-2"])
        recording = Recording(rt.pool)
        placing = Runtime(rt.name, settings, recording, rt.nc, rt.js)  # type: ignore[arg-type]
        assert await Scheduler(placing, settings).place_once() == 3
        texts = [" ".join(q.split()) for q, _ in recording.calls]
        chose = [i for i, q in enumerate(texts) if q.startswith(CHOICE)]
        locked = [i for i, q in enumerate(texts) if LOCK in q]
        assert len(chose) == 1 and len(locked) == 1 and locked[0] < chose[0]
        # Nothing queued ran before: the budget is not asked and no clock is read again. The statements of a
        # pass of three grants (no budget, no gang): free?, lock, organisations, choice, placed before, lock the
        # candidates, executors, gang policy, rendezvous in use, admitting, running, cohorts, the granted jobs,
        # their traces, then the grants' two writes (the jobs; their events with their outbox rows): 16, whatever
        # the number of grants (one more is a regression to explain; the number of grants must never multiply
        # them).
        assert len(texts) == 16, "\n".join(texts)
    finally:
        await rt.close()


async def test_a_job_leaving_the_queue_while_the_budget_answers_is_not_granted_and_a_second_replica_chooses_after(
        env):
    settings = env.settings(QueueSettings).model_copy(update={"max_jobs_per_pass": 3})
    rt = await Runtime.open("queue", settings, schema=SCHEMA, package="services.queue")
    try:
        first, gone, third, fourth = await _submit(rt, settings, 4)
        await rt.pool.execute("UPDATE queue.jobs SET lease_epoch = 1 WHERE id = $1", first)  # ran before: asked
        await _executors(rt, ["ex-0", "ex-1", "ex-2", "ex-3"])
        budget = SlowBudget(settings)
        placing = Runtime(rt.name, settings, rt.pool, budget, rt.js)  # type: ignore[arg-type]
        one = asyncio.create_task(Scheduler(placing, settings).place_once())
        await asyncio.wait_for(budget.asked.wait(), 30)
        # The first pass holds the placement lock and waits for the budget; it has chosen first, gone, third.
        recording = Recording(rt.pool)
        replica = Runtime(rt.name, settings, recording, budget, rt.js)  # type: ignore[arg-type]
        two = asyncio.create_task(Scheduler(replica, settings).place_once())
        await eventually(lambda: any(LOCK in q for q, _ in recording.calls), timeout=15.0,
                         what="the second replica to ask for the placement lock")
        await asyncio.sleep(0.3)
        # The second replica waits for the lock and has chosen nothing yet (no choice before the lock).
        assert not two.done() and not any(q.lstrip().startswith(CHOICE) for q, _ in recording.calls)
        # No row is locked while the budget answers: a cancel of a chosen job goes through at once.
        await asyncio.wait_for(rt.pool.execute("UPDATE queue.jobs SET state = 'cancelled' WHERE id = $1", gone), 10)
        budget.release.set()
        assert await asyncio.wait_for(one, 60) == 2
        assert await asyncio.wait_for(two, 60) == 1  # chose after the first committed: only the fourth is left
        rows = {r["id"]: r for r in await rt.pool.fetch("SELECT id, state, workers FROM queue.jobs")}
        assert rows[gone]["state"] == "cancelled" and not rows[gone]["workers"]
        assert {rows[j]["state"] for j in (first, third, fourth)} == {"running"}
        held = [w for j in (first, third, fourth) for w in rows[j]["workers"]]
        assert len(held) == len(set(held)) == 3  # no executor holds two jobs, no job granted twice
        assert budget.asked_about == [first]  # exactly the chosen job that ran before
        runs = [RunJob.decode(r["payload"]) for r in await rt.pool.fetch(
            "SELECT payload FROM queue.outbox WHERE subject LIKE '%.run' ORDER BY id")]
        assert sorted(r.job_id for r in runs) == sorted([first, third, fourth])
        # What each grant carries of its ceiling: the asked job its ceiling less the 10 consumed, the others whole.
        assert {r.job_id: r.remaining_gpu_seconds for r in runs} == {
            r.job_id: max(0.0, r.spec.gpu_ceiling_seconds - (10.0 if r.job_id == first else 0.0)) for r in runs}
    finally:
        await rt.close()
