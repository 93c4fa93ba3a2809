"""A Consumer declared on a FastStream broker (libs/runtime/edge_stream.py), without a server: it becomes an
EdgeSubscriber of the durable, stream and batch it names, typed with its contracts; a batch handed to it goes
through FastStream's process_message to the handler, and what the handler raises comes back to the edge's rules
(one bad message isolated, the rest acknowledged); each service declares a publisher for what it sends."""

from __future__ import annotations

import threading

import pytest
from faststream import AckPolicy, Context, Depends

from libs.contracts.commands import CommandOutcome
from libs.contracts.dead import DeadLetter
from libs.contracts.envelope import RejectedMessage
from libs.contracts.jobs import JobEvent
from libs.contracts.telemetry import Heartbeat
from libs.contracts.subjects import Subjects
from libs.runtime.edge import Consumer, from_sender
from libs.runtime.edge_loop import ConsumerLoop
from libs.runtime.edge_stream import (EdgeBroker, EdgeSubscriber, declare_publishers, injected, provide, publishes,
                                      subscribe)
from libs.runtime.errors import PermanentError
from tests.support.edgefakes import FakeMsg, FakeReporter, decode, started


def test_a_consumer_becomes_a_typed_batch_pull_subscriber_of_its_durable():
    async def handle(_: list[Heartbeat]) -> None:
        return None

    broker = EdgeBroker()
    consumer = Consumer("teto.hb.*", "HB", "queue-heartbeats", None, handle, batch=500,
                        read=from_sender(Heartbeat.decode))
    sub = subscribe(broker, Subjects(), consumer, None, service="queue")
    assert isinstance(sub, EdgeSubscriber) and sub in broker.subscribers
    assert sub.extra_options["durable"] == "queue-heartbeats" and sub.stream.name == "TETO_HB"
    assert sub.pull_sub.batch and sub.pull_sub.batch_size == 500 and sub.ack_policy is AckPolicy.MANUAL
    (call,) = sub.calls
    assert call.handler._original_call.__annotations__["batch"] is Heartbeat


async def test_a_batch_goes_through_faststream_and_a_failing_message_is_isolated_by_the_edge():
    handled: list[list[str]] = []

    async def handle(items: list[str]) -> None:
        if "poison" in items:
            raise PermanentError("never")
        handled.append(items)

    broker = EdgeBroker()
    consumer = Consumer("teto.hb.*", "HB", "svc-x", decode, handle)
    reporter = FakeReporter()
    loop = ConsumerLoop(js=None, subjects=Subjects(), consumer=consumer, reporter=reporter)
    started(broker, subscribe(broker, Subjects(), consumer, loop))
    msgs = [FakeMsg(b"a"), FakeMsg(b"poison"), FakeMsg(b"b")]
    await loop.settle(msgs)
    assert handled == [["a"], ["b"]]  # the batch failed whole, then each alone
    assert [m.outcome for m in msgs] == ["ack", "ack", "ack"]  # the poison one acked once buried
    assert [letter.consumer for letter in reporter.buried] == ["svc-x"]


@pytest.mark.parametrize(("publisher", "part", "expected"), [
    ("queue", "queue", True), ("queue, gateway", "gateway", True), ("queue", "budget", False),
    ("any consumer", "health", True), ("owning service", "queue", True), ("owning service", "budget", False),
    ("every service replica", "audit", True)])
def test_which_part_publishes_a_catalogue_message(publisher, part, expected):
    assert publishes(publisher, part) is expected


def test_a_service_declares_a_publisher_for_each_message_it_sends():
    broker = EdgeBroker()
    declare_publishers(broker, Subjects("acme"), "queue")
    declared = {p.specification.config.schema_: p.specification.config for p in broker.publishers}
    for model in (JobEvent, CommandOutcome, RejectedMessage, DeadLetter):
        assert model in declared, model.__name__
    assert Heartbeat not in declared  # the executor's, not the queue's
    assert all(p.subject.template.startswith(("acme.", "_INBOX.")) for p in broker.publishers)


async def test_the_dispatch_benchmark_measures_both_paths():
    from bench.bench_edge_dispatch import run

    r = await run(50, 10)
    assert r["figure"] > 0 and r["reference"] > 0 and r["ratio"] > 0 and "us a batch" in r["note"]


class RecordingClient:
    """What a nats-py message publishes through its connection (a reply, or an acknowledgement)."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []

    async def publish(self, subject: str, payload: bytes = b"", reply: str = "", headers=None) -> None:
        self.published.append((subject, payload))


async def test_a_responder_answers_each_request_once_and_a_listener_publishes_nothing():
    """A core subscriber that answers itself must not let FastStream acknowledge the message too: acknowledging
    a core message publishes to its reply subject, a second answer the bus refuses a part that may answer once."""
    from nats.aio.msg import Msg

    from libs.contracts.leases import LeaseRenewReply, LeaseRenewRequest
    from libs.runtime.edge_reply import Responder
    from libs.runtime.edge_stream import listen, respond

    async def renew(_: LeaseRenewRequest) -> LeaseRenewReply:
        return LeaseRenewReply(ok=True)

    broker, heard = EdgeBroker(), []
    responder = Responder("teto.rpc.lease.renew.*", "queue", LeaseRenewRequest.decode, renew,
                          lambda reason: LeaseRenewReply(ok=False, reason=reason))
    answering = started(broker, respond(broker, responder, FakeReporter(), service="queue"))

    async def hear(msg) -> None:
        heard.append(msg.subject)

    listening = started(broker, listen(broker, "teto.outcome.>", hear, title="outcomes", description="", model=bytes))
    client = RecordingClient()
    request = LeaseRenewRequest(job_id="j1", executor_id="e1", epoch=1).encode()
    await answering.process_message(Msg(_client=client, subject="teto.rpc.lease.renew.e1", reply="_INBOX.e1.1",
                                        data=request))
    assert [(s, LeaseRenewReply.decode(b).ok) for s, b in client.published] == [("_INBOX.e1.1", True)]
    client.published.clear()
    # An outcome a service stored with a JetStream publish arrives with the publisher's acknowledgement inbox.
    await listening.process_message(Msg(_client=client, subject="teto.outcome.submit.c1", reply="_INBOX.q.2",
                                        data=b"{}"))
    assert heard == ["teto.outcome.submit.c1"] and client.published == []


# -- dependencies from the broker's context (edge_stream.injected) ------------------------------------------------

async def test_a_handlers_dependencies_come_from_the_context_in_line_and_its_batch_is_never_cast():
    threads: list[int] = []

    def stamp(clock: str = Context()) -> str:  # a provider with a dependency of its own, as budget's ``admission``
        threads.append(threading.get_ident())
        return f"at {clock}"

    got: list[tuple] = []

    async def handle(beats: list[Heartbeat], store: dict = Context(), stamped: str = Depends(stamp)) -> None:
        got.append((beats, store, stamped))

    broker = EdgeBroker()
    provide(broker, store={"rows": 1}, clock="T0")
    call = injected(broker, handle)
    batch = [{"not": "a heartbeat"}]  # the edge validated the batch already: passed as it is, never cast
    await call(batch)
    provide(broker, clock="T1")  # looked up on each call, not when declared
    await call(batch)
    assert got == [(batch, {"rows": 1}, "at T0"), (batch, {"rows": 1}, "at T1")] and got[0][0] is batch
    # Resolved in this thread: fast_depends' async path would run each resolver in a worker thread (0.6 ms a batch).
    assert threads == [threading.get_ident()] * 2


async def test_a_handler_that_declares_nothing_is_called_as_it_is():
    async def handle(items: list[str]) -> None:
        return None

    assert injected(EdgeBroker(), handle) is handle
