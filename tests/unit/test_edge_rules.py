"""The edge every service consumes through (libs/runtime/edge.py), on hand-made messages: what is acknowledged,
refused, isolated, redelivered with back-off, or dead-lettered, and that one bad message never holds back the
others in its batch."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

import asyncpg
import pytest

from libs.contracts.commands import SubmitJob
from libs.contracts.dead import DeadCause
from libs.contracts.envelope import ContractError
from libs.contracts.leases import LeaseRenewReply, LeaseRenewRequest
from libs.contracts.subjects import Subjects
from libs.runtime.edge import Consumer
from libs.runtime.edge_loop import ConsumerLoop
from libs.runtime.edge_reply import Responder, serve_responder
from libs.runtime.edge_stream import EdgeBroker, provide, subscribe
from libs.runtime.errors import PermanentError, is_permanent
from services.queue.handlers import consumers as queue_consumers
from services.queue.handlers import decode_progress
from tests.support.edgefakes import FakeMsg, FakeReporter, Recorder, decode, loop, started

pytestmark = pytest.mark.unit


async def test_a_handled_batch_is_acknowledged_in_one_call():
    handle = Recorder()
    edge, _ = loop(handle)
    msgs = [FakeMsg(b"a"), FakeMsg(b"b")]
    await edge.settle(msgs)
    assert handle.calls == [["a", "b"]] and [m.outcome for m in msgs] == ["ack", "ack"]


async def test_another_schema_on_the_subject_is_acknowledged_unread():
    handle = Recorder()
    edge, reporter = loop(handle, accepts=lambda body: body != b"other")
    msgs = [FakeMsg(b"other"), FakeMsg(b"a")]
    await edge.settle(msgs)
    assert handle.calls == [["a"]] and [m.outcome for m in msgs] == ["ack", "ack"] and not reporter.rejected


async def test_skipped_messages_are_each_acknowledged_and_all_counted():
    edge, _ = loop(Recorder(), accepts=lambda body: body != b"other")
    msgs = [FakeMsg(b"other"), FakeMsg(b"a"), FakeMsg(b"other"), FakeMsg(b"other")]
    await edge.settle(msgs)
    assert [m.outcome for m in msgs] == ["ack"] * 4
    assert (edge.counters.skipped, edge.counters.handled) == (3, 1)


async def test_a_malformed_message_is_refused_visibly_terminated_answered_and_the_rest_handled():
    handle, answered = Recorder(), []

    async def on_malformed(body: bytes, reason: str) -> None:
        answered.append((body, reason))

    edge, reporter = loop(handle, on_malformed=on_malformed)
    msgs = [FakeMsg(b"malformed!"), FakeMsg(b"a")]
    await edge.settle(msgs)
    assert [m.outcome for m in msgs] == ["term", "ack"] and handle.calls == [["a"]]
    assert reporter.rejected == [("teto.hb.x", b"malformed!", "value: not a number")]
    assert answered == [(b"malformed!", "value: not a number")]


@pytest.mark.parametrize("error", [PermanentError("step out of range"),
                                   asyncpg.DataError("invalid byte sequence for encoding UTF8: 0x00"),
                                   asyncpg.NumericValueOutOfRangeError("bigint out of range")],
                         ids=["PermanentError", "DataError", "NumericValueOutOfRange"])
async def test_one_poison_message_is_dead_lettered_and_never_holds_back_its_batch(error):
    handle = Recorder(fail_on={"poison": error})
    edge, reporter = loop(handle)
    msgs = [FakeMsg(b"a", seq=1), FakeMsg(b"poison", seq=2, headers={"Nats-Msg-Id": "m2"}), FakeMsg(b"b", seq=3)]
    await edge.settle(msgs)
    # The batch failed once; then each message alone: the good ones go through, the poison one is buried.
    assert handle.calls == [["a", "poison", "b"], ["a"], ["poison"], ["b"]]
    assert [m.outcome for m in msgs] == ["ack", "ack", "ack"]
    (letter,) = reporter.buried
    assert letter.cause is DeadCause.PERMANENT and letter.payload == b"poison" and letter.stream_seq == 2
    assert letter.subject == "teto.hb.x" and letter.headers == {"Nats-Msg-Id": "m2"} and letter.consumer == "svc-test"
    assert edge.counters.dead == 1 and edge.counters.isolated_batches == 1


async def test_a_transiently_failing_message_is_redelivered_with_growing_back_off_then_dead_lettered():
    handle = Recorder(fail_on={"flaky": KeyError("a bug in one handler branch")})
    edge, reporter = loop(handle, max_deliver=3, backoff=(0.5, 2.0))
    delays = []
    for delivery in (1, 2):
        msg = FakeMsg(b"flaky", delivered=delivery)
        await edge.settle([msg])
        (what, delay), = msg.settled
        assert what == "nak"
        delays.append(delay)
    assert delays == [0.5, 2.0] and not reporter.buried
    last = FakeMsg(b"flaky", delivered=3)
    await edge.settle([last])
    assert last.outcome == "ack"
    (letter,) = reporter.buried
    assert letter.cause is DeadCause.EXHAUSTED and "3 deliveries" in letter.reason and "KeyError" in letter.reason


async def test_while_the_database_is_away_the_batch_is_held_and_applied_when_it_is_back_spending_no_delivery():
    outage = [2]

    async def handle(items: list[str]) -> None:
        handle.calls.append(list(items))
        if outage[0]:
            outage[0] -= 1
            raise ConnectionRefusedError("connection refused")

    handle.calls = []
    edge, reporter = loop(handle, backoff=(0.01,))
    msgs = [FakeMsg(b"a"), FakeMsg(b"b")]
    await edge.settle(msgs)
    # Never isolated (not a message's fault), never nak'd (no delivery spent), never buried: held, then applied.
    assert handle.calls == [["a", "b"]] * 3
    assert [m.outcome for m in msgs] == ["ack", "ack"] and [m.extended for m in msgs] == [2, 2]
    assert not reporter.buried and edge.counters.waits == 2


async def test_a_message_the_consumer_kept_dying_on_is_buried_before_it_is_handled_again():
    handle = Recorder()
    edge, reporter = loop(handle, max_deliver=2)
    msg = FakeMsg(b"a", delivered=2 + 3 + 1)
    await edge.settle([msg])
    assert handle.calls == [] and msg.outcome == "ack"
    assert reporter.buried[0].cause is DeadCause.EXHAUSTED and "without an outcome" in reporter.buried[0].reason


async def test_a_dead_letter_that_cannot_be_published_leaves_the_message_unacknowledged():
    handle = Recorder(fail_on={"poison": PermanentError("never")})
    edge, reporter = loop(handle)
    reporter.bury_fails = True
    msg = FakeMsg(b"poison")
    await edge.settle([msg])
    assert msg.outcome == "nak" and edge.counters.dead == 0


def test_a_consumer_takes_either_a_decoder_or_a_reader():
    with pytest.raises(ValueError):
        Consumer("s", "HB", "d", None, Recorder())
    with pytest.raises(ValueError):
        Consumer("s", "HB", "d", decode, Recorder(), read=lambda m: m)


@pytest.mark.parametrize(("error", "permanent"), [
    (PermanentError("x"), True), (ContractError("t/1", "bad"), True), (asyncpg.DataError("nul"), True),
    (asyncpg.UniqueViolationError("dup"), True), (OSError("reset"), False), (TimeoutError(), False),
    (asyncpg.CannotConnectNowError("starting"), False), (KeyError("bug"), False)],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v))
def test_which_failures_are_permanent(error, permanent):
    assert is_permanent(error) is permanent


# -- responders -----------------------------------------------------------------------------------------------

class FakeNats:
    def __init__(self) -> None:
        self.cb = None

    async def subscribe(self, subject, queue, cb):
        self.cb = cb
        return SimpleNamespace(subject=subject, queue=queue)


@dataclass
class Request:
    data: bytes
    subject: str = "teto.rpc.lease.renew"
    reply: str = "_INBOX.1"
    answers: list[bytes] = field(default_factory=list)

    async def respond(self, body: bytes) -> None:
        self.answers.append(body)


async def test_a_responder_answers_a_malformed_request_and_stays_silent_when_its_handler_fails():
    nc, reporter = FakeNats(), FakeReporter()
    failing = [True]

    async def renew(req: LeaseRenewRequest) -> LeaseRenewReply:
        if failing[0]:
            raise ConnectionError("database away")
        return LeaseRenewReply(ok=True)

    responder = Responder("teto.rpc.lease.renew", "queue", LeaseRenewRequest.decode, renew,
                          lambda reason: LeaseRenewReply(ok=False, reason=f"malformed: {reason}"))
    await serve_responder(nc, responder, reporter)  # type: ignore[arg-type]
    bad = Request(b'{"schema": "teto.rpc.lease.renew/1"}')
    await nc.cb(bad)
    reply = LeaseRenewReply.decode(bad.answers[0])
    assert not reply.ok and "malformed" in reply.reason and len(reporter.rejected) == 1
    good = Request(LeaseRenewRequest(job_id="j1", executor_id="e1", epoch=1).encode())
    await nc.cb(good)
    assert good.answers == []  # the requester times out and asks again
    failing[0] = False
    await nc.cb(good)
    assert LeaseRenewReply.decode(good.answers[0]).ok


# -- the queue's declarations -----------------------------------------------------------------------------------

@pytest.mark.parametrize("body", [b"not json", b'{"kind": "teleport"}', b"[1, 2]", b'{"kind": "started"}'],
                         ids=["not json", "unknown kind", "not an object", "missing fields"])
def test_malformed_progress_fails_its_contract(body):
    with pytest.raises(ContractError):
        decode_progress(body)


class QueueRecorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str):
        async def record(*args):
            self.calls.append((name, args))
        return record


async def test_a_malformed_command_is_answered_and_the_next_one_still_served():
    commands = QueueRecorder()
    submit = next(c for c in queue_consumers(Subjects()) if c.durable == "queue-submit")
    edge = ConsumerLoop(js=None, subjects=Subjects(), consumer=submit, reporter=FakeReporter())  # type: ignore[arg-type]
    # Declared on a broker as the runtime does: the handler and its refusal find ``commands`` in its context.
    broker = EdgeBroker()
    started(broker, subscribe(broker, Subjects(), submit, edge))
    provide(broker, commands=commands)
    good = SubmitJob(actor="ann", spec={"workload": {"kind": "finetune"}})
    msgs = [FakeMsg(b'{"schema": "teto.cmd.submit/1", "command_id": "c1", "actor": 7}', subject="teto.cmd.submit"),
            FakeMsg(good.encode(), subject="teto.cmd.submit")]
    await edge.settle(msgs)
    (name, args), served = commands.calls
    assert name == "refuse_malformed" and args[0] == "submit" and "actor" in args[2]
    assert served == ("submit_all", ([good],)) and [m.outcome for m in msgs] == ["term", "ack"]


def test_a_value_that_cannot_be_a_subject_token_fails_permanently():
    with pytest.raises(ValueError) as err:
        Subjects().progress("a.b", "ex1")
    assert is_permanent(err.value)


async def test_a_reader_that_raises_refuses_the_message_and_the_batch_goes_on():
    def read(m):
        if m.data == b"boom":
            raise KeyError("no such field")
        return m.data.decode()

    handle = Recorder()
    edge = ConsumerLoop(js=None, subjects=Subjects(), reporter=FakeReporter(),  # type: ignore[arg-type]
                        consumer=Consumer("teto.hb.*", "HB", "svc-test", None, handle, read=read))
    msgs = [FakeMsg(b"boom"), FakeMsg(b"a")]
    await edge.settle(msgs)
    assert [m.outcome for m in msgs] == ["term", "ack"] and handle.calls == [["a"]]
    assert "KeyError" in edge.reporter.rejected[0][2]


async def test_the_consumer_loop_outlives_a_batch_it_cannot_settle():
    class OneBatchThenStop:
        def __init__(self):
            self.fetches = 0

        async def fetch(self, batch, timeout):
            self.fetches += 1
            if self.fetches == 3:
                raise asyncio.CancelledError
            return [FakeMsg(b"a")]

        async def unsubscribe(self):
            pass

    async def broken_settle(msgs):
        raise RuntimeError("a bug in settling")

    edge, _ = loop(Recorder())
    sub = OneBatchThenStop()
    edge._sub = sub
    edge.settle = broken_settle  # type: ignore[method-assign]
    with pytest.raises(asyncio.CancelledError):
        await edge.run()
    assert sub.fetches == 3  # it went on fetching after each failed batch
