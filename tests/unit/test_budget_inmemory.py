"""The budget's usage handlers on FastStream's in-memory ``TestNatsBroker`` (no server): its own declarations
(services/budget/handlers.py) and the edge's rules, with a database-less ledger, a clock the test moves and the
budget's settings in the broker's context. A usage record is judged against its lease grant at the injected
clock's time with the injected settings' slack (domain/grants.py), charged, and reaching the job's ceiling is
announced once; a report sent under another executor's name never reaches the ledger."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal

import pytest

from libs.contracts.subjects import Subjects
from libs.contracts.usage import UsageRecord, UsageReport
from services.budget import store
from services.budget.domain.grants import Grant, JobLease, judge_batch
from services.budget.domain.ledger import Account, on_usage
from services.budget.domain.usage import Charge
from services.budget.grants import Admission
from services.budget.handlers import Counters, consumers, responders
from services.budget.settings import BudgetSettings
from tests.support.inmemory import T0, FakeClock, in_memory
from tests.support.memory_pool import MemoryPool

pytestmark = pytest.mark.unit

S = Subjects()
JOB = "job-1"


class MemoryLedger:
    """The ledger without PostgreSQL: one job granted to ``ex1`` at T0, its account, the wall seconds each run
    charged; usage judged and charged with the budget's own rules (``judge_batch``, ``on_usage``)."""

    def __init__(self, ceiling: float) -> None:
        self.grants = {(JOB, 1): Grant(JOB, 1, ("ex1",), 1, T0)}
        self.accounts = {JOB: Account(ceiling=ceiling)}
        self.used: dict[tuple[str, str, int], float] = {}
        self.admissions: list[Admission] = []

    async def record_usage(self, charges: list[Charge], admission: Admission) -> store.Effects:
        self.admissions.append(admission)
        judged = judge_batch(charges, self.grants, {JOB: JobLease(epoch=1)}, self.used, now=admission.now,
                             slack_seconds=admission.slack_seconds)
        effects = store.Effects(refused=len(judged.refused), held=len(judged.held))
        for c in judged.charged:
            run = (c.job_id, c.executor_id, c.epoch)
            self.used[run] = self.used.get(run, 0.0) + c.wall_seconds
            decision = on_usage(self.accounts[c.job_id], c.gpu_seconds)
            self.accounts[c.job_id] = decision.account
            effects.charged += c.gpu_seconds
            if decision.exhausted:
                effects.events.append(store.exhausted_event(S, c.job_id, decision.account))
        return effects


def report(seq: int, wall_seconds: float, executor: str = "ex1") -> UsageReport:
    return UsageReport(executor_id=executor, node_id="n1", records=[UsageRecord(
        job_id=JOB, epoch=1, seq=seq, devices=1, wall_seconds=wall_seconds)])


def budget(clock: FakeClock, ledger: MemoryLedger, counters: Counters, slack: float = 30.0):
    settings = BudgetSettings.from_env(env={"TETO_USAGE_CLOCK_SLACK_SECONDS": str(slack)})
    return in_memory("budget", S, consumers(S, settings), responders(S, settings), ledger=ledger,
                     counters=counters, clock=clock, settings=settings)


async def test_usage_within_the_grant_is_charged_and_the_ceiling_reached_is_announced_once():
    clock, ledger, counters = FakeClock(T0 + timedelta(seconds=300)), MemoryLedger(ceiling=100.0), Counters()
    async with budget(clock, ledger, counters) as (bus, reporter):
        await bus.publish(report(1, 60.0).encode(), S.usage("ex1"))
        assert ledger.accounts[JOB].consumed == 60.0 and counters.exhausted == 0
        await bus.publish(report(2, 50.0).encode(), S.usage("ex1"))
        await bus.publish(report(3, 5.0).encode(), S.usage("ex1"))
    assert ledger.accounts[JOB].consumed == 115.0 and ledger.accounts[JOB].exhausted_for == 100.0
    assert counters.exhausted == 1 and counters.refused == 0 and not reporter.rejected


@pytest.mark.parametrize(("since_grant", "slack", "charged"), [(30, 5.0, False), (30, 40.0, True), (60, 5.0, True)],
                         ids=["clock 30 s after the grant, slack 5: refused", "slack 40: charged",
                              "clock 60 s after: charged"])
async def test_a_record_is_judged_at_the_injected_clocks_time_with_the_settings_slack(since_grant, slack, charged):
    clock, ledger, counters = FakeClock(T0 + timedelta(seconds=since_grant)), MemoryLedger(ceiling=1000.0), Counters()
    async with budget(clock, ledger, counters, slack=slack) as (bus, _):
        await bus.publish(report(1, 60.0).encode(), S.usage("ex1"))
    (admission,) = ledger.admissions
    assert admission.now == clock.now() and admission.slack_seconds == slack
    assert (ledger.accounts[JOB].consumed, counters.refused) == ((60.0, 0) if charged else (0.0, 1))


async def test_a_report_under_another_executors_name_is_refused_before_the_ledger():
    clock, ledger, counters = FakeClock(T0 + timedelta(seconds=300)), MemoryLedger(ceiling=100.0), Counters()
    async with budget(clock, ledger, counters) as (bus, reporter):
        await bus.publish(report(1, 60.0, executor="ex1").encode(), S.usage("ex2"))
    assert ledger.admissions == [] and ledger.accounts[JOB].consumed == 0.0
    ((subject, _, reason),) = reporter.rejected
    assert subject == S.usage("ex2") and "ex1" in reason


async def test_a_malformed_status_request_is_answered_refused_with_its_reason_and_the_client_reads_unknown():
    """Before, the refusal's reply itself broke its contract (an empty job id), so no answer went out and the
    requester waited out its timeout."""
    from libs.contracts.budget import BudgetStatusReply
    from services.queue.budget_client import consumed_of

    clock, ledger, counters = FakeClock(T0), MemoryLedger(ceiling=100.0), Counters()
    async with budget(clock, ledger, counters) as (bus, reporter):
        answer = await bus.request(b'{"schema": "teto.rpc.budget.status/1", "job_id": ""}', S.rpc_budget_status)
    reply = BudgetStatusReply.decode(answer.body)
    assert not reply.known and reply.job_id is None and reply.reason.startswith("malformed status request")
    assert consumed_of(reply, JOB) is None  # about no job: unknown, never "consumed nothing"
    assert [subject for subject, _, _ in reporter.rejected] == [S.rpc_budget_status]


# -- the status and orgs responders, on a pool-less double of the budget's tables ----------------------------------

ORG_SINCE = T0 - timedelta(days=1)


@dataclass
class MemoryBudgetTables:
    """``budget.jobs`` (org, ceiling, consumed) and ``budget.ledger`` (job, GPU-seconds, when the stretch ended)
    without PostgreSQL, answering the two responders' queries (store.status, orgs.org_status) as the SQL does."""

    jobs: dict[str, tuple[str, float | None, float]]
    ledger: list[tuple[str, float, datetime]] = field(default_factory=list)

    def answer(self, method: str, query: str, args: tuple):
        if method == "fetchrow" and "FROM budget.jobs WHERE job_id = $1" in query:
            (job_id,) = args
            if job_id not in self.jobs:
                return None
            _, ceiling, consumed = self.jobs[job_id]
            return {"ceiling_seconds": ceiling, "consumed_seconds": consumed}
        if method == "fetch" and "sum(l.gpu_seconds)" in query:
            orgs, since = args
            sums: dict[str, float] = {}
            for job_id, gpu_seconds, ended in self.ledger:
                org = self.jobs[job_id][0]
                if org in orgs and ended >= since:
                    sums[org] = sums.get(org, 0.0) + gpu_seconds
            return [{"org": org, "consumed": Decimal(str(total))} for org, total in sums.items()]
        if method == "fetch" and "consumed_seconds FROM budget.jobs WHERE job_id = ANY" in query:
            (job_ids,) = args
            return [{"job_id": j, "consumed_seconds": self.jobs[j][2]} for j in job_ids if j in self.jobs]
        raise AssertionError(f"a query the responders do not make: {method} {query}")


def tables() -> MemoryBudgetTables:
    return MemoryBudgetTables(
        jobs={"job-a1": ("org-a", 100.0, 40.0), "job-a2": ("org-a", None, 25.0), "job-b1": ("org-b", 50.0, 50.0),
              "job-c1": ("org-c", 10.0, 3.0)},
        ledger=[("job-a1", 30.0, T0), ("job-a1", 10.0, ORG_SINCE - timedelta(seconds=1)),  # before the period
                ("job-a2", 25.0, ORG_SINCE), ("job-b1", 50.0, T0), ("job-c1", 3.0, T0)])


def budget_rpc(db: MemoryBudgetTables):
    settings = BudgetSettings.from_env(env={})
    return in_memory("budget", S, (), responders(S, settings), pool=MemoryPool(db.answer))


@pytest.mark.parametrize(("job_id", "known", "ceiling", "consumed"),
                         [("job-a1", True, 100.0, 40.0), ("job-a2", True, None, 25.0), ("job-zz", False, None, 0.0)],
                         ids=["known, with a ceiling", "known, no ceiling", "not known"])
async def test_the_status_responder_answers_a_jobs_ceiling_and_consumption_and_whether_it_is_known(
        job_id, known, ceiling, consumed):
    from libs.contracts.budget import BudgetStatusReply, BudgetStatusRequest

    async with budget_rpc(tables()) as (bus, reporter):
        answer = await bus.request(BudgetStatusRequest(job_id=job_id).encode(), S.rpc_budget_status)
    reply = BudgetStatusReply.decode(answer.body)
    assert (reply.job_id, reply.known, reply.ceiling_seconds, reply.consumed_seconds, reply.reason) == (
        job_id, known, ceiling, consumed, None)
    assert not reporter.rejected


async def test_the_orgs_responder_answers_each_asked_orgs_consumption_since_its_period_and_each_named_job():
    from libs.contracts.budget import OrgBudgetReply, OrgBudgetRequest

    db = tables()
    async with budget_rpc(db) as (bus, reporter):
        answer = await bus.request(OrgBudgetRequest(orgs=["org-a", "org-b", "org-quiet"], since=ORG_SINCE,
                                                    jobs=["job-a1", "job-b1", "job-zz"]).encode(), S.rpc_budget_orgs)
    reply = OrgBudgetReply.decode(answer.body)
    # org-a: 30 s in the period, 25 s at its very start, not the 10 s before it; org-c was not asked; an org with
    # no charge in the period is absent (nothing consumed), as is a job the budget does not know.
    assert reply.org_consumed == {"org-a": 55.0, "org-b": 50.0}
    assert reply.job_consumed == {"job-a1": 40.0, "job-b1": 50.0}
    assert not reporter.rejected


async def test_a_malformed_orgs_request_is_refused_visibly_and_answered_with_an_empty_reply():
    from libs.contracts.budget import OrgBudgetReply

    db = tables()
    pool = MemoryPool(db.answer)
    settings = BudgetSettings.from_env(env={})
    async with in_memory("budget", S, (), responders(S, settings), pool=pool) as (bus, reporter):
        answer = await bus.request(b'{"schema": "teto.rpc.budget.orgs/1", "orgs": ["org-a"]}', S.rpc_budget_orgs)
    reply = OrgBudgetReply.decode(answer.body)
    assert reply.org_consumed == {} and reply.job_consumed == {}
    ((subject, _, reason),) = reporter.rejected
    assert subject == S.rpc_budget_orgs and "since" in reason
    assert pool.conn.calls == []  # never reached the tables
