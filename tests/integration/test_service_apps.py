"""A service's consumers run as subscribers of its FastStream app (libs/runtime/edge_stream.py) on a real
nats-server: each batch reaches the handler through FastStream (its context holds the batch message), the edge's
rules still settle every message (a malformed one refused, a poison one dead-lettered alone, the rest
acknowledged), and stopping the app leaves the durable, whose unacknowledged messages a later app receives."""

from __future__ import annotations

import base64
import contextlib

import pytest
from faststream import FastStream
from faststream.nats.message import NatsBatchMessage

from libs.contracts.dead import DeadLetter
from libs.contracts.envelope import utcnow
from libs.contracts.telemetry import Heartbeat
from libs.runtime import natsfetch
from libs.runtime.edge import Consumer, from_sender
from libs.runtime.edge_stream import EdgeSubscriber
from libs.runtime.errors import PermanentError
from libs.runtime.service import Runtime
from tests.support import builders
from tests.support.services import eventually

pytestmark = pytest.mark.integration


def beat(executor: str, step: int) -> Heartbeat:
    return builders.heartbeat(executor, sent_at=utcnow(), step=step, interval_seconds=1, progress_interval_seconds=1)


async def test_each_batch_reaches_its_handler_through_the_services_faststream_app(env):
    rt = await Runtime.open("fsapp", env.settings(), schema=None, package=None)
    seen: list[tuple[str, int]] = []
    through: list[object] = []

    async def handle(beats: list[Heartbeat]) -> None:
        through.append(rt.broker.context.get_local("message"))  # the broker's context, as in any FastStream handler
        if any(b.step == 13 for b in beats):
            raise PermanentError("step 13 can never be stored")
        seen.extend((b.executor_id, b.step) for b in beats)

    try:
        await rt.consume([Consumer(rt.subjects.heartbeat_all, "HB", "fsapp-hb", None, handle, batch=50,
                                   read=from_sender(Heartbeat.decode))])
        assert isinstance(rt.app, FastStream) and natsfetch.installed()
        (subscriber,) = rt.broker.subscribers
        assert isinstance(subscriber, EdgeSubscriber)
        for step in range(20):
            await rt.js.publish(rt.subjects.heartbeat("ex1"), beat("ex1", step).encode())
        await rt.js.publish(rt.subjects.heartbeat("ex2"), b"{not json")  # refused, never handled
        await rt.js.publish(rt.subjects.heartbeat("ex3"), beat("ex2", 1).encode())  # claims another sender
        await eventually(lambda: len(seen) == 19 and rt.dead == 1 and rt.rejected == 2, timeout=15,
                         what="19 heartbeats handled, one dead-lettered, two refused")
        assert seen == [("ex1", s) for s in range(20) if s != 13]  # stream order, the poison one alone out
        assert through and all(isinstance(m, NatsBatchMessage) for m in through)
        info = await rt.js.consumer_info(rt.subjects.stream_name("HB"), "fsapp-hb")
        assert info.num_ack_pending == 0 and info.num_pending == 0
        letter = await _one_dead_letter(rt)
        assert letter.consumer == "fsapp-hb" and Heartbeat.decode(base64.b64decode(letter.payload_b64)).step == 13
    finally:
        await rt.close()


async def test_a_stopped_app_leaves_its_durable_and_the_next_app_receives_what_came_meanwhile(env):
    rt = await Runtime.open("fsapp", env.settings(), schema=None, package=None)
    seen: list[int] = []

    async def handle(beats: list[Heartbeat]) -> None:
        seen.extend(b.step for b in beats)

    consumer = Consumer(rt.subjects.heartbeat_all, "HB", "fsapp-again", None, handle,
                        read=from_sender(Heartbeat.decode))
    try:
        await rt.consume([consumer])
        await rt.js.publish(rt.subjects.heartbeat("ex1"), beat("ex1", 1).encode())
        await eventually(lambda: seen == [1], what="the first heartbeat handled")
        await rt.stop_consuming()
        assert rt.app is None
        await rt.js.publish(rt.subjects.heartbeat("ex1"), beat("ex1", 2).encode())
        await rt.consume([consumer])
        await eventually(lambda: seen == [1, 2], what="the heartbeat published while stopped, handled once")
    finally:
        await rt.close()


async def _one_dead_letter(rt: Runtime) -> DeadLetter:
    sub = await rt.js.pull_subscribe(rt.subjects.dead_all, durable=None)
    try:
        async def fetched():
            with contextlib.suppress(TimeoutError):
                return [DeadLetter.decode(m.data) for m in await sub.fetch(1, timeout=0.5)]
            return None

        (letter,) = await eventually(fetched, timeout=10, what="the dead letter")
        return letter
    finally:
        await sub.unsubscribe()
