"""FastStream's batch pull loop on a real nats-server, with and without libs/runtime/natsfetch.py.

Short fetch timeouts under a steady trickle of messages make nats-py 2.16 end some multi-message fetches in a
bare ``asyncio.TimeoutError``. Unpatched, FastStream 0.7.8's loop dies on it and the messages it had fetched
wait out their AckWait (two minutes here); patched, every message reaches the handler long before that.
"""

from __future__ import annotations

import asyncio

import nats.errors
import pytest
from faststream.nats import JStream, NatsBroker, PullSub
from nats.js.api import ConsumerConfig
from nats.js.client import JetStreamContext

from libs.runtime import natsfetch
from tests.support.services import eventually

pytestmark = pytest.mark.integration

MESSAGES = 400
ACK_WAIT = 120.0  # a message the dead loop held comes back only after this: far beyond the test's wait


async def _trickle(env, durable: str, handled: list[str]) -> NatsBroker:
    broker = NatsBroker(env.infra.nats_url, logger=None)
    stream = JStream(name=f"{env.prefix}_FSPULL", subjects=[f"{env.prefix}.fspull.>"])

    @broker.subscriber(f"{env.prefix}.fspull.{durable}", stream=stream, durable=durable,
                       config=ConsumerConfig(ack_wait=ACK_WAIT),
                       pull_sub=PullSub(batch_size=20, timeout=0.005, batch=True))
    async def handle(batch: list[str]) -> None:
        handled.extend(batch)

    await broker.start()
    for i in range(MESSAGES):
        await broker.publish(f"m{i}", f"{env.prefix}.fspull.{durable}", stream=stream.name)
        await asyncio.sleep(0.002)
    return broker


async def test_every_message_reaches_a_batch_handler_well_within_its_ack_wait(env):
    plain = JetStreamContext.PullSubscription.fetch
    natsfetch.uninstall()
    natsfetch.install()
    handled: list[str] = []
    try:
        broker = await _trickle(env, "patched", handled)
        try:
            await eventually(lambda: len(set(handled)) == MESSAGES, timeout=30,
                             what=f"all {MESSAGES} messages handled")
        finally:
            await broker.stop()
    finally:
        JetStreamContext.PullSubscription.fetch = plain
    assert sorted(set(handled), key=lambda m: int(m[1:])) == [f"m{i}" for i in range(MESSAGES)]


async def test_the_defect_is_upstream(env):
    """nats-py still raises the bare timeout that kills FastStream's loop. When this fails, upstream is fixed:
    natsfetch.py can go (its docstring says how)."""
    natsfetch.uninstall()
    plain = JetStreamContext.PullSubscription.fetch
    bare: list[BaseException] = []

    async def spy(self, *args, **kwargs):
        try:
            return await plain(self, *args, **kwargs)
        except asyncio.TimeoutError as exc:
            if not isinstance(exc, nats.errors.TimeoutError):
                bare.append(exc)
            raise

    JetStreamContext.PullSubscription.fetch = spy
    handled: list[str] = []
    try:
        broker = await _trickle(env, "plain", handled)
        try:
            await eventually(lambda: bare, timeout=30, what="a fetch ending in a bare asyncio.TimeoutError")
        finally:
            await broker.stop()
    finally:
        JetStreamContext.PullSubscription.fetch = plain
