"""The agent's outgoing JetStream messages, in order, without ever blocking the training process.

Progress is queued here and sent by one task, so a slow or unreachable server never stalls the pipe reader
(and so the child writing to it). Step reports are disposable: one that cannot be sent is dropped (the next
carries a newer step) and, if the queue grows, the oldest are dropped first. Everything else (started,
checkpoints, finished) is retried with the same message id until the server acknowledges it; JetStream's
de-duplication makes the retries harmless. A message that can never be sent (larger than the server's max
payload, refused by its own contract, refused by the stream) is dropped with an error and counted in
``undeliverable``: retrying it would hold every message behind it forever.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from dataclasses import dataclass, field

from nats.errors import MaxPayloadError
from nats.js import JetStreamContext
from nats.js.errors import BadRequestError

from libs.contracts.envelope import ContractError, Envelope
from libs.contracts.telemetry import StepReport
from libs.runtime import bus, tracing

log = logging.getLogger(__name__)

MAX_QUEUED = 1000


class Sent(enum.Enum):
    ACKED = "acked"  # the server has it
    FAILED = "failed"  # not now (server away, timeout): the same message may succeed later
    NEVER = "never"  # the same message can never be sent: do not retry it


def can_never_send(exc: BaseException) -> bool:
    """Errors that a retry of the very same bytes would meet again (as opposed to a server that is away)."""
    if isinstance(exc, MaxPayloadError | ContractError):
        return True
    if isinstance(exc, BadRequestError):  # the stream refuses the message itself (e.g. over its max_msg_size)
        return True
    # Encoding the message failed (pydantic's serialization errors are ValueErrors): it is malformed.
    return isinstance(exc, ValueError | TypeError)


@dataclass
class _Item:
    subject: str
    msg: Envelope
    done: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    # The sender's trace context: published by another task, the message still carries the sender's trace.
    trace: dict[str, str] = field(default_factory=tracing.carrier)

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
        self.undeliverable = 0  # messages dropped because they can never be sent

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
        return await self._attempt(subject, msg, timeout) is Sent.ACKED

    async def _attempt(self, subject: str, msg: Envelope, timeout: float | None = None) -> Sent:
        try:
            await bus.publish(self.js, subject, msg, timeout=timeout or self.timeout)
            return Sent.ACKED
        except Exception as exc:  # noqa: BLE001 - unreachable server: the caller keeps its state and goes on
            if can_never_send(exc):
                self.undeliverable += 1
                log.error("dropping a %s for %s that can never be sent (%d so far): %r", type(msg).__name__,
                          subject, self.undeliverable, exc)
                return Sent.NEVER
            self.failures += 1
            if self.failures == 1 or self.failures % 50 == 0:
                log.warning("cannot publish to %s (%d failures so far): %r", subject, self.failures, exc)
            return Sent.FAILED

    async def run(self) -> None:
        while True:
            while not self._queue:
                self._wake.clear()
                await self._wake.wait()
            item = self._queue[0]
            with tracing.attached(item.trace):
                sent = await self._attempt(item.subject, item.msg)
            if sent is Sent.FAILED and not item.disposable:
                await asyncio.sleep(self.retry_seconds)
                continue
            self._queue.popleft()
            if sent is Sent.FAILED:
                self.dropped += 1
            if not item.done.done():
                item.done.set_result(sent is Sent.ACKED)
