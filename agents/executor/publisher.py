"""The agent's outgoing JetStream messages, in order, without ever blocking the training process.

Progress is queued here and sent by one task, so a slow or unreachable server never stalls the pipe reader
(and so the child writing to it). Step reports are disposable: one that cannot be sent is dropped (the next
carries a newer step) and, if the queue grows, the oldest are dropped first. Everything else (started,
checkpoints, finished) is retried with the same message id until the server acknowledges it; JetStream's
de-duplication makes the retries harmless.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field

from nats.js import JetStreamContext

from libs.contracts.envelope import Envelope
from libs.contracts.telemetry import StepReport
from libs.runtime import bus

log = logging.getLogger(__name__)

MAX_QUEUED = 1000


@dataclass
class _Item:
    subject: str
    msg: Envelope
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())

    @property
    def disposable(self) -> bool:
        return isinstance(self.msg, StepReport)


class Publisher:
    def __init__(self, js: JetStreamContext, *, timeout: float, retry_seconds: float) -> None:
        self.js = js
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self._queue: deque[_Item] = deque()
        self._wake = asyncio.Event()
        self.dropped = 0
        self.failures = 0

    def send(self, subject: str, msg: Envelope) -> asyncio.Future:
        """Queue a message; the future resolves once the server acknowledged it (or it was dropped)."""
        item = _Item(subject, msg)
        self._queue.append(item)
        if len(self._queue) > MAX_QUEUED:
            for old in list(self._queue):
                if old.disposable and old is not item:
                    self._queue.remove(old)
                    old.done.set_result(False)
                    self.dropped += 1
                    break
        self._wake.set()
        return item.done

    async def publish_now(self, subject: str, msg: Envelope, timeout: float | None = None) -> bool:
        """One attempt outside the queue (heartbeats, registration); False when the server did not ack."""
        try:
            await bus.publish(self.js, subject, msg, timeout=timeout or self.timeout)
            return True
        except Exception as exc:  # noqa: BLE001 - unreachable server: the caller keeps its state and goes on
            self.failures += 1
            if self.failures == 1 or self.failures % 50 == 0:
                log.warning("cannot publish to %s (%d failures so far): %r", subject, self.failures, exc)
            return False

    async def run(self) -> None:
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            item = self._queue[0]
            ok = await self.publish_now(item.subject, item.msg)
            if ok or item.disposable:
                self._queue.popleft()
                if not ok:
                    self.dropped += 1
                if not item.done.done():
                    item.done.set_result(ok)
            else:
                await asyncio.sleep(self.retry_seconds)
