"""The queue's command handlers and its lease-renewal responder on FastStream's in-memory ``TestNatsBroker`` (no
server): its own declarations (services/queue/handlers.py) and the edge's rules, with database-less commands that
decide with the queue's own lifecycle (domain/lifecycle.py ``decide``) at a clock the test moves, and runs that
answer renewals, all in the broker's context. A submit makes a queued job, a cancel of it a cancelled one; a
malformed command is answered (its ``on_malformed``, injected as the handlers are) and refused visibly; a renewal
is answered on the request, and one sent for another executor is refused with the malformed reply."""

from __future__ import annotations

from datetime import timedelta

import pytest

from libs.contracts.commands import CancelJob, CommandOutcome, SubmitJob
from libs.contracts.jobs import JobState
from libs.contracts.leases import LeaseRenewReply, LeaseRenewRequest
from libs.contracts.subjects import Subjects
from services.queue.domain.facts import Cancel, Job, Submitted
from services.queue.domain.lifecycle import decide
from services.queue.effects import answer_of
from services.queue.handlers import consumers, responders
from tests.support.inmemory import T0, FakeClock, in_memory

pytestmark = pytest.mark.unit

S = Subjects()


class MemoryCommands:
    """The queue's commands without PostgreSQL: jobs by id, each command decided by the lifecycle at ``clock``."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.jobs: dict[str, Job] = {}
        self.outcomes: list[CommandOutcome] = []
        self.batches: list[int] = []

    def _decide(self, cmd, job_id: str, fact) -> CommandOutcome:
        result = decide(self.jobs.get(job_id), fact, self.clock.now())
        if not hasattr(result, "reason"):  # a transition
            self.jobs[job_id] = result.job
        self.outcomes.append(outcome := answer_of(cmd, job_id, result))
        return outcome

    async def submit_all(self, cmds: list[SubmitJob]) -> list[CommandOutcome]:
        self.batches.append(len(cmds))
        return [self._decide(c, c.job_id, Submitted(c.job_id, c.spec.name, c.actor, c.spec, c.org)) for c in cmds]

    async def cancel(self, cmd: CancelJob) -> CommandOutcome:
        return self._decide(cmd, cmd.job_id, Cancel(cmd.reason, cmd.actor))

    async def refuse_malformed(self, kind: str, body: bytes, reason: str) -> None:
        self.outcomes.append(CommandOutcome(command_id="c-malformed", kind=kind, accepted=False,
                                            reason=f"malformed command: {reason}", by="queue"))


class MemoryRuns:
    """Renewals: the lease of ``job-1`` epoch 2 is ``ex1``'s, extended to a minute after the clock's time."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    async def renew(self, req: LeaseRenewRequest) -> LeaseRenewReply:
        if (req.job_id, req.epoch) != ("job-1", 2):
            return LeaseRenewReply(ok=False, reason="stale epoch")
        return LeaseRenewReply(ok=True, expires_at=self.clock.now() + timedelta(seconds=60))


def queue(clock: FakeClock, commands: MemoryCommands):
    return in_memory("queue", S, consumers(S), responders(S), commands=commands, runs=MemoryRuns(clock),
                     policies=None, tenancy=None)


async def test_a_submit_queues_its_job_at_the_injected_time_and_a_cancel_cancels_it():
    clock = FakeClock()
    commands = MemoryCommands(clock)
    submit = SubmitJob(actor="ann", spec={"workload": {"kind": "finetune"}, "name": "tune"})
    async with queue(clock, commands) as (bus, reporter):
        await bus.publish(submit.encode(), S.cmd("submit"))
        job = commands.jobs[submit.job_id]
        assert (job.state, job.owner, job.name, job.created_at) == (JobState.QUEUED, "ann", "tune", T0)
        clock.advance(5)
        await bus.publish(CancelJob(actor="bob", job_id=submit.job_id).encode(), S.cmd("cancel"))
        await bus.publish(submit.encode(), S.cmd("submit"))  # the same job id again: refused by the lifecycle
    assert commands.jobs[submit.job_id].state is JobState.CANCELLED
    assert [(o.kind, o.accepted) for o in commands.outcomes] == [("submit", True), ("cancel", True),
                                                                 ("submit", False)]
    assert commands.batches == [1, 1] and not reporter.rejected


async def test_a_malformed_command_is_answered_refused_visibly_and_reaches_no_handler():
    clock = FakeClock()
    commands = MemoryCommands(clock)
    async with queue(clock, commands) as (bus, reporter):
        await bus.publish(b'{"schema": "teto.cmd.cancel/1", "command_id": "c-malformed", "actor": 7}', S.cmd("cancel"))
    (answer,) = commands.outcomes
    assert answer.kind == "cancel" and not answer.accepted and "actor" in answer.reason and commands.jobs == {}
    assert [subject for subject, _, _ in reporter.rejected] == [S.cmd("cancel")]


async def test_a_renewal_is_answered_and_one_for_another_executor_is_refused_with_the_malformed_reply():
    clock = FakeClock()
    async with queue(clock, MemoryCommands(clock)) as (bus, reporter):
        mine = await bus.request(LeaseRenewRequest(job_id="job-1", epoch=2, executor_id="ex1").encode(),
                                 S.rpc_lease_renew_of("ex1"))
        stale = await bus.request(LeaseRenewRequest(job_id="job-1", epoch=1, executor_id="ex1").encode(),
                                  S.rpc_lease_renew_of("ex1"))
        foreign = await bus.request(LeaseRenewRequest(job_id="job-1", epoch=2, executor_id="ex1").encode(),
                                    S.rpc_lease_renew_of("ex2"))
    assert LeaseRenewReply.decode(mine.body).expires_at == T0 + timedelta(seconds=60)
    assert LeaseRenewReply.decode(stale.body).reason == "stale epoch"
    refused = LeaseRenewReply.decode(foreign.body)
    assert not refused.ok and refused.reason.startswith("malformed renewal request")
    assert [subject for subject, _, _ in reporter.rejected] == [S.rpc_lease_renew_of("ex2")]
