"""The budget's usage handlers on FastStream's in-memory ``TestNatsBroker`` (no server): its own declarations
(services/budget/handlers.py) and the edge's rules, with a database-less ledger, a clock the test moves and the
budget's settings in the broker's context. A usage record is judged against its lease grant at the injected
clock's time with the injected settings' slack (domain/grants.py), charged, and reaching the job's ceiling is
announced once; a report sent under another executor's name never reaches the ledger."""

from __future__ import annotations

from datetime import timedelta

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
