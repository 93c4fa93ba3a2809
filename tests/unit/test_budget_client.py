"""The queue's one budget client (services/queue/budget_client.py) and its two users: what ``known`` means (the
budget never saw the job: consumed 0), and that no answer, a timeout, a bad reply or a reply about another job is
unknown (None), never a number. A requeue refuses on unknown; a grant carries an unknown remainder."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from nats.errors import NoRespondersError

from libs.contracts.budget import BudgetStatusReply, BudgetStatusRequest
from libs.contracts.commands import CommandOutcome, RequeueJob
from libs.contracts.jobs import JobSpec, JobState
from libs.contracts.subjects import Subjects
from services.queue import budget_client, commands, org_budgets, remaining
from services.queue.commands import BUDGET_UNAVAILABLE, Commands
from services.queue.domain.lifecycle import Job, Refusal, Requeue
from services.queue.settings import QueueSettings

pytestmark = pytest.mark.unit

SUBJECTS = Subjects("teto")
T0 = datetime(2026, 12, 5, tzinfo=UTC)


def known(job_id: str, consumed: float) -> bytes:
    return BudgetStatusReply(job_id=job_id, known=True, ceiling_seconds=600, consumed_seconds=consumed).encode()


def never_seen(job_id: str) -> bytes:
    return BudgetStatusReply(job_id=job_id, known=False).encode()


class FakeNats:
    """Answers ``request`` with what ``answer(job_id)`` gives: reply bytes, or an exception to raise."""

    def __init__(self, answer) -> None:  # noqa: ANN001
        self.answer = answer
        self.asked: list[tuple[str, str, float]] = []

    async def request(self, subject: str, data: bytes, timeout: float) -> SimpleNamespace:
        job_id = BudgetStatusRequest.decode(data).job_id
        self.asked.append((subject, job_id, timeout))
        found = self.answer(job_id)
        if isinstance(found, BaseException):
            raise found
        return SimpleNamespace(data=found)


def runtime(answer) -> SimpleNamespace:  # noqa: ANN001
    return SimpleNamespace(nc=FakeNats(answer), subjects=SUBJECTS)


@pytest.mark.parametrize(("answer", "expected"), [
    (lambda j: known(j, 450.0), 450.0),
    (lambda j: known(j, 0.0), 0.0),
    (never_seen, 0.0),  # never charged: an answer, consumed nothing
    (lambda j: TimeoutError(), None),
    (lambda j: NoRespondersError(), None),
    (lambda j: ConnectionError("closed"), None),
    (lambda j: b"not json", None),
    (lambda j: b'{"schema": "teto.rpc.budget.status.reply/1", "job_id": "j1"}', None),  # no "known"
    (lambda j: known("another", 450.0), None),
], ids=["known", "known-zero", "not-known", "timeout", "no-responders", "connection", "not-json", "bad-reply",
        "another-job"])
async def test_what_a_job_consumed_is_a_number_only_when_the_budget_answered_about_it(answer, expected):
    rt = runtime(answer)
    assert await budget_client.consumed(rt, "j1", 2.5) == expected
    assert rt.nc.asked == [(SUBJECTS.rpc_budget_status, "j1", 2.5)]


@pytest.mark.parametrize(("reply", "expected"), [
    (BudgetStatusReply(job_id="j1", known=True, consumed_seconds=12.5), 12.5),
    (BudgetStatusReply(job_id="j1", known=False), 0.0),
    (BudgetStatusReply(job_id="j1", known=False, consumed_seconds=7.0), 0.0),  # never seen: nothing charged
    (BudgetStatusReply(job_id="j2", known=True, consumed_seconds=12.5), None),
    (BudgetStatusReply(job_id="j2", known=False), None),  # not "never seen": it says nothing of j1
], ids=["known", "not-known", "not-known-ignores-the-number", "another-job", "another-job-not-known"])
def test_consumed_of_a_reply(reply, expected):
    assert budget_client.consumed_of(reply, "j1") == expected


# -- the grant: the remainder it carries -------------------------------------------------------------------

def placed_before(job_id: str) -> Job:
    spec = JobSpec(workload={"kind": "finetune"}, gpu_ceiling_seconds=600)
    return Job(id=job_id, name="t", owner="ann", spec=spec, state=JobState.QUEUED, created_at=T0, updated_at=T0,
               lease_epoch=2)


async def test_a_grant_carries_the_ceiling_less_what_was_consumed_and_unknown_without_an_answer():
    answers = {"seen": known("seen", 450.0), "new": never_seen("new"), "silent": TimeoutError(),
               "garbled": b"{}"}
    jobs = [placed_before(j) for j in answers]
    left = await remaining.remaining_for(runtime(answers.__getitem__), jobs, timeout=5.0)
    assert left == {"seen": 150.0, "new": 600.0, "silent": None, "garbled": None}


# -- the requeue: unknown refuses, never guessed -------------------------------------------------------------

class Deciding(Commands):
    """The requeue path up to the fact it decides (``_decide`` stores it; here it is recorded)."""

    def __init__(self, rt: SimpleNamespace) -> None:
        super().__init__(rt, QueueSettings(), units=SimpleNamespace())
        self.facts: list[object] = []

    async def _decide(self, cmd, job_id, fact):  # noqa: ANN001
        self.facts.append(fact)
        return CommandOutcome(command_id=cmd.command_id, kind=cmd.KIND, accepted=not isinstance(fact, Refusal),
                              job_id=job_id, by="queue")


class NeverAnswered:
    """A pool whose connection has no stored outcome for any command."""

    def acquire(self) -> NeverAnswered:
        return self

    async def __aenter__(self) -> NeverAnswered:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def fetchval(self, *args: object) -> None:
        return None


@pytest.mark.parametrize(("answer", "fact"), [
    (lambda j: known(j, 103.0), Requeue(500.0, 103.0, "op")),
    (never_seen, Requeue(500.0, 0.0, "op")),
    (lambda j: TimeoutError(), Refusal(BUDGET_UNAVAILABLE)),
    (lambda j: NoRespondersError(), Refusal(BUDGET_UNAVAILABLE)),
    (lambda j: b"not json", Refusal(BUDGET_UNAVAILABLE)),
    (lambda j: never_seen("another"), Refusal(BUDGET_UNAVAILABLE)),
], ids=["known", "not-known", "timeout", "no-responders", "bad-reply", "another-job"])
async def test_a_requeue_decides_on_the_consumption_the_budget_gave_and_refuses_without_one(answer, fact,
                                                                                             monkeypatch):
    checked: list[float] = []

    async def budget_fits(runtime, pool, job_id, new_ceiling, consumed, now, timeout):  # noqa: ANN001
        checked.append(consumed)
        return None

    monkeypatch.setattr(org_budgets, "requeue_refusal", budget_fits)
    rt = runtime(answer)
    rt = replace_ns(rt, pool=NeverAnswered(), clock=SimpleNamespace(now=lambda: T0))
    decider = Deciding(rt)
    cmd = RequeueJob(actor="op", job_id="j1", gpu_ceiling_seconds=500)
    outcome = await decider.requeue(cmd)
    assert decider.facts == [fact] and outcome.accepted is isinstance(fact, Requeue)
    assert checked == ([fact.consumed] if isinstance(fact, Requeue) else [])  # never checked on a guess
    assert rt.nc.asked == [(SUBJECTS.rpc_budget_status, "j1", QueueSettings().budget_rpc_timeout_seconds)]
    assert commands.BUDGET_UNAVAILABLE == org_budgets.UNAVAILABLE  # one 503 reason for both refusals


def replace_ns(ns: SimpleNamespace, **changes: object) -> SimpleNamespace:
    return SimpleNamespace(**{**vars(ns), **changes})


def test_a_placed_again_job_is_asked_and_a_fresh_one_is_not():
    fresh = replace(placed_before("fresh"), lease_epoch=0)
    assert remaining.needs_asking(placed_before("again")) and not remaining.needs_asking(fresh)
