"""The edge's pull loop: fetch a batch, one batch ahead, and settle it (``edge_settle.py``).

Every service's consumers run it inside their FastStream subscribers (``edge_stream.py``: the subscriber's
consuming task is ``drive``); ``run`` (subscribe, then drive) is the same loop without FastStream, for a caller
that has no broker (tests, the bench's reference row).

One batch is fetched ahead: while a batch is handled, the next one is on its way. Batches are still handled one at
a time in the order fetched, so one executor's heartbeats and one job's reports are applied in stream order; a
held batch (outage) keeps the batch behind it too, and at shutdown a batch fetched but not handled is handed back
at once (nak). One ``fetch`` is one batch, handled at once: FastStream 0.7.8's own batch loop fetches again until
the batch is full or its timeout ran out, which would hold a lone command for the whole timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from nats.aio.msg import Msg
from nats.errors import MsgAlreadyAckdError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig

from . import quickfetch
from .edge import CRASH_MARGIN, SERVER_MAX_DELIVER_FACTOR, Consumer, M, linger_before_next
from .edge_settle import Settler, fetched

log = logging.getLogger("libs.runtime.edge")


def consumer_config(c: Consumer[Any]) -> ConsumerConfig:
    """The durable's server-side settings: explicit acks, the ack wait, a last-resort delivery limit far past the
    edge's own (the edge buries long before it) and room for a batch ahead."""
    return ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=c.ack_wait_seconds,
                          max_deliver=SERVER_MAX_DELIVER_FACTOR * (c.max_deliver + CRASH_MARGIN),
                          max_ack_pending=max(1000, 4 * c.batch))


@dataclass
class ConsumerLoop(Settler[M]):
    """Runs one Consumer: fetch a batch, decode, handle, settle each message (see the module docstring)."""

    _sub: JetStreamContext.PullSubscription | None = None

    async def subscribe(self) -> None:
        """Create or bind the durable (before the service says it is ready)."""
        if self._sub is not None:
            return
        c = self.consumer
        while True:
            try:
                self._sub = await self.js.pull_subscribe(c.subject, durable=c.durable,
                                                         stream=self.subjects.stream_name(c.stream),
                                                         config=consumer_config(c))
                quicken(self._sub, c.durable)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - JetStream not ready yet (a leader election, say)
                log.warning("%s: cannot subscribe (%r); retrying", c.durable, exc)
                await asyncio.sleep(self.retry_seconds)

    async def run(self) -> None:
        """Subscribe, then fetch and settle batches until cancelled; the durable stays, the subscription goes."""
        await self.subscribe()
        sub = self._sub
        try:
            await self.drive(sub)
        finally:
            # An open pull request would hold the connection's drain at shutdown; the durable stays.
            self._sub = None
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def drive(self, sub: Any) -> None:
        """Fetch and settle batches from ``sub`` until cancelled. The next batch is fetched while the current one is
        handled (one batch ahead): handling stays one batch at a time in stream order, so per-executor and per-job
        order is what it was without the prefetch; only the wait for the broker overlaps the handler's work. With
        ``read_ahead`` the batch ahead is also read meanwhile, and the one after it fetched once this one settled."""
        read_ahead = self.consumer.read_ahead
        ahead: asyncio.Task[list[Msg]] = asyncio.create_task(self._fetch(sub))
        applying: asyncio.Task[None] | None = None
        try:
            while True:
                msgs = await ahead
                linger = linger_before_next(len(msgs), self.consumer.batch, self.consumer.linger_seconds)
                if not read_ahead:
                    ahead = self._ahead = asyncio.create_task(self._fetch(sub, linger))
                decoded = (await self._logged(self.read(msgs)) or []) if msgs else []
                if applying is not None:  # (read ahead) the batch before, handled meanwhile; never raises
                    applying = await applying
                if read_ahead:
                    ahead = self._ahead = asyncio.create_task(self._fetch(sub, linger))
                if decoded and read_ahead:
                    applying = asyncio.create_task(self._logged(self.apply(decoded)))
                elif decoded:
                    await self._logged(self.apply(decoded))
        finally:
            await _give_back(ahead, applying)

    async def _logged(self, work: Awaitable[Any]) -> Any:
        try:  # reading or handling a batch
            return await work
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a bug here must not end the consumer: its messages come back
            log.exception("%s: settling a batch failed; its unsettled messages return after the ack wait", self.durable)
            return None

    async def _fetch(self, sub: Any, linger: float = 0.0) -> list[Msg]:
        """One batch (asked for after ``linger`` seconds: ``linger_before_next``), or none when nothing came within
        the wait or the fetch failed (after a pause)."""
        if linger > 0:
            await asyncio.sleep(linger)
        try:
            return await sub.fetch(self.consumer.batch, timeout=self.consumer.wait_seconds)
        except asyncio.TimeoutError:  # nothing to do (nats.errors.TimeoutError is one too)
            return []
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - server restarting, connection lost: try again
            log.warning("%s: fetch failed (%r); retrying", self.durable, exc)
            await asyncio.sleep(self.retry_seconds)
            return []


def quicken(sub: Any, durable: str) -> None:
    if not quickfetch.quicken(sub):  # a message already arrived costs no task (quickfetch.py)
        log.warning("%s: nats-py's subscription is not the one quickfetch knows; fetching as is", durable)


async def _give_back(ahead: asyncio.Task[list[Msg]], applying: asyncio.Task[None] | None = None) -> None:
    """At shutdown: stop the batch being handled (read ahead) and the fetch ahead; a batch that already arrived is
    handed back at once (nak without delay) for another replica, instead of waiting out its ack wait. Never raises."""
    for task in filter(None, (applying, ahead)):
        task.cancel()  # no-op when done
        with contextlib.suppress(BaseException):
            await task
    for m in fetched(ahead):
        with contextlib.suppress(MsgAlreadyAckdError, Exception):
            await m.nak()
