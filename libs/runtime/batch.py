"""Batch consumption of a JetStream durable, acknowledged only after the batch's handler returned.

Why not FastStream's batch subscriber (faststream 0.7.8 with nats-py 2.16): its pull loop gathers a batch over
several ``fetch`` calls and catches only ``nats.errors.TimeoutError``, while nats-py raises a plain
``asyncio.TimeoutError`` when its own timer fires before the server's 408 (a race on a loaded machine). The
loop task then dies and restarts, and the messages it had gathered are neither handled nor acknowledged: they
wait out the consumer's AckWait (30 s) before redelivery. Here one ``fetch`` is one batch, handled at once.

Used by the services whose hot paths batch (heartbeats, usage, audit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.errors import MsgAlreadyAckdError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig

log = logging.getLogger(__name__)

Handler = Callable[[list[Msg]], Awaitable[None]]


@dataclass
class BatchConsumer:
    """Runs ``handle`` on each batch of a durable pull consumer (shared by every replica that runs it).

    ``handle`` may terminate messages it refuses (``msg.term()``); the rest are acknowledged after it returns.
    If it raises, the batch's unacknowledged messages are redelivered after ``retry_delay_seconds``.
    """

    js: JetStreamContext
    subject: str
    stream: str
    durable: str
    handle: Handler
    batch: int = 200
    wait_seconds: float = 0.5  # how long a fetch waits for the first message
    retry_delay_seconds: float = 1.0
    ack_wait_seconds: float = 30.0

    _sub: JetStreamContext.PullSubscription | None = None

    async def subscribe(self) -> None:
        """Create or bind the durable (before the service says it is ready)."""
        if self._sub is None:
            self._sub = await self._subscribe()

    async def run(self) -> None:
        await self.subscribe()
        sub = self._sub
        try:
            while True:
                try:
                    msgs = await sub.fetch(self.batch, timeout=self.wait_seconds)
                except asyncio.TimeoutError:  # nothing to do (nats.errors.TimeoutError is one too)
                    continue
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - server restarting, connection lost: try again
                    log.warning("%s: fetch failed (%r); retrying", self.durable, exc)
                    await asyncio.sleep(self.retry_delay_seconds)
                    continue
                await self._handle(msgs)
        finally:
            # An open pull request would hold the connection's drain at shutdown; the durable stays.
            self._sub = None
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _subscribe(self) -> JetStreamContext.PullSubscription:
        config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=self.ack_wait_seconds,
                                max_ack_pending=max(1000, 4 * self.batch))
        while True:
            try:
                return await self.js.pull_subscribe(self.subject, durable=self.durable, stream=self.stream,
                                                    config=config)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - JetStream not ready yet (a leader election, say)
                log.warning("%s: cannot subscribe (%r); retrying", self.durable, exc)
                await asyncio.sleep(self.retry_delay_seconds)

    async def _handle(self, msgs: list[Msg]) -> None:
        try:
            await self.handle(msgs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - database trouble or a bug: redeliver, never lose
            log.warning("%s: batch of %d failed (%r); redelivering in %.1fs", self.durable, len(msgs), exc,
                        self.retry_delay_seconds)
            for m in msgs:
                # Already terminated, or the connection is gone: AckWait redelivers it then.
                with contextlib.suppress(MsgAlreadyAckdError, OSError, Exception):
                    await m.nak(delay=self.retry_delay_seconds)
            return
        for m in msgs:
            # A lost ack means a redelivery, which every handler here stores idempotently.
            with contextlib.suppress(MsgAlreadyAckdError, OSError, Exception):
                await m.ack()
