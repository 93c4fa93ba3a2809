"""The gateway waits for command outcomes through ONE subscription to every outcome subject
(services/gateway/commands.py): each request gets its own command's outcome, outcomes nobody here waits for are
dropped unread, a malformed one is ignored, no answer in time is a pending (202) answer, and a subscription that
could not be opened is a bus failure retried by the next request."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from libs.contracts.commands import CommandOutcome, SubmitJob
from libs.contracts.subjects import Subjects
from libs.runtime.edge_stream import EdgeBroker
from services.gateway.commands import BusUnavailable, Commands, Outcomes
from tests.support import builders

pytestmark = pytest.mark.unit
S = Subjects()


def outcome(command_id: str, accepted: bool = True) -> CommandOutcome:
    return CommandOutcome(command_id=command_id, kind="submit", accepted=accepted, by="queue")


async def test_an_outcome_reaches_the_request_waiting_for_its_command_and_no_other():
    outcomes = Outcomes()
    a, b = outcomes.expect("a"), outcomes.expect("b")
    outcomes.arrived(S.outcome("submit", "b"), outcome("b", accepted=False).encode())
    outcomes.arrived(S.outcome("submit", "z"), outcome("z").encode())  # another replica's: dropped unread
    assert b.done() and not b.result().accepted and not a.done() and outcomes.ignored == 1
    outcomes.arrived(S.outcome("submit", "a"), b"not an outcome")  # garbage on our subject: still waiting
    assert not a.done()
    outcomes.arrived(S.outcome("submit", "a"), outcome("a").encode())
    assert a.result().command_id == "a"


async def test_two_requests_for_one_command_id_share_its_outcome_and_forgetting_one_keeps_the_other():
    outcomes = Outcomes()
    first, second = outcomes.expect("k"), outcomes.expect("k")
    assert first is second
    outcomes.arrived(S.outcome("submit", "k"), outcome("k").encode())
    outcomes.forget("k", first)
    assert second.result().command_id == "k" and outcomes.waiting == {}
    later = outcomes.expect("k")  # a retry after the answer waits for a new one
    assert later is not first and not later.done()


class FakeBus:
    """A NATS connection and JetStream context: the 'queue' answers each published command on its outcome
    subject through whatever subscriptions are open (the gateway's FastStream subscriber), unless told to stay
    silent."""

    def __init__(self, silent: bool = False, subscribe_fails: int = 0) -> None:
        self.subscriptions: list[tuple[str, object]] = []
        self.silent = silent
        self.subscribe_fails = subscribe_fails

    def jetstream(self, **kw):
        return self

    async def subscribe(self, subject, cb=None, **kw):
        if self.subscribe_fails:
            self.subscribe_fails -= 1
            raise ConnectionError("bus away")
        self.subscriptions.append((subject, cb))
        return SimpleNamespace(subject=subject)

    async def publish(self, subject, data, headers=None, timeout=None):
        cmd = SubmitJob.decode(data)
        if self.silent:
            return
        for pattern, cb in self.subscriptions:
            assert pattern == S.outcome_all
            await cb(SimpleNamespace(subject=S.outcome("submit", cmd.command_id), data=outcome(cmd.command_id).encode(),
                                     reply="", headers=None))


def commands(fake: FakeBus, timeout: float = 5.0) -> Commands:
    broker = EdgeBroker(fake)  # the gateway runtime's FastStream broker, on the fake connection

    async def faststream() -> EdgeBroker:
        await broker.connect()
        return broker

    runtime = SimpleNamespace(nc=fake, js=fake, subjects=S, faststream=faststream)
    return Commands(runtime, timeout)  # type: ignore[arg-type]


async def test_many_concurrent_requests_share_one_subscription_and_each_gets_its_own_outcome():
    fake = FakeBus()
    gateway = commands(fake)
    cmds = [builders.submit() for _ in range(20)]
    sent = await asyncio.gather(*(gateway.send(c) for c in cmds))
    assert [s.outcome.command_id for s in sent] == [c.command_id for c in cmds]
    assert len(fake.subscriptions) == 1 and gateway.outcomes.waiting == {}


async def test_no_outcome_in_time_is_a_pending_answer_and_leaves_nothing_waiting():
    gateway = commands(FakeBus(silent=True), timeout=0.05)
    cmd = builders.submit()
    sent = await gateway.send(cmd)
    assert sent.command_id == cmd.command_id and sent.outcome is None and gateway.outcomes.waiting == {}


async def test_a_subscription_that_cannot_be_opened_is_a_bus_failure_and_the_next_request_opens_it():
    fake = FakeBus(subscribe_fails=1)
    gateway = commands(fake)
    with pytest.raises(BusUnavailable):
        await gateway.send(builders.submit())
    assert (await gateway.send(builders.submit())).outcome.accepted and len(fake.subscriptions) == 1
    assert len((await gateway.runtime.faststream()).subscribers) == 1  # declared once, started again
