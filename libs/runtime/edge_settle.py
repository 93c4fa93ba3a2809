"""What the edge decides for each message of a fetched batch (the rules of ``edge.py``'s docstring), whoever
fetched it: the FastStream subscriber every service runs (``edge_stream.py``) or the edge's own loop
(``edge_loop.py``).

``read`` settles at once what is never handled (another schema's message: acked unread; a malformed one: refused
on ``teto.rejected.<service>`` and terminated; one past the crash margin: buried), ``apply`` hands the rest to the
handler through ``deliver`` and settles each message by the outcome: acknowledged; held through an outage
without spending a delivery; isolated message by message after a failed batch; redelivered with back-off;
dead-lettered (permanent, or past ``max_deliver``). A ``Settler`` never raises but for cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic

from nats.aio.msg import Msg
from nats.errors import MsgAlreadyAckdError

from libs.contracts.dead import DeadCause, dead_letter
from libs.contracts.envelope import ContractError
from libs.contracts.subjects import Subjects

from . import logs, metrics, tracing
from .acksubject import deliveries as _deliveries, stream_seq as _stream_seq
from .edge import CRASH_MARGIN, Consumer, EdgeCounters, M, Reporter, is_unavailable
from .errors import is_permanent, reason_of

log = logging.getLogger("libs.runtime.edge")


@dataclass
class Settler(Generic[M]):
    """Reads, hands over and settles the batches of one Consumer (see the module docstring)."""

    js: Any  # JetStreamContext | None (None in tests that only settle)
    subjects: Subjects
    consumer: Consumer[M]
    reporter: Reporter
    counters: EdgeCounters = field(default_factory=EdgeCounters)
    retry_seconds: float = 1.0
    # How a decoded batch reaches the handler: the consumer's own ``handle`` unless a FastStream subscriber
    # carries it through its middlewares and handler (edge_stream.py).
    deliver: Callable[[list[tuple[Msg, M]]], Awaitable[Any]] | None = None
    _ahead: asyncio.Task[list[Msg]] | None = None  # the next batch, fetched while this one is handled

    @property
    def durable(self) -> str:
        return self.consumer.durable

    def _count(self, outcome: str, n: int = 1) -> None:
        """One place for what the edge did: the in-process counters (tests) and the exported series."""
        setattr(self.counters, outcome, getattr(self.counters, outcome) + n)
        metrics.EDGE_MESSAGES.labels(self.reporter.name, self.durable, self.consumer.stream, outcome).inc(n)

    async def _handle(self, decoded: list[tuple[Msg, M]]) -> Any:
        if self.deliver is not None:
            return await self.deliver(decoded)
        return await self.consumer.handle([item for _, item in decoded])

    async def settle(self, msgs: list[Msg]) -> None:
        """Decode, handle and settle one fetched batch; never raises (but for cancellation)."""
        await self.apply(await self.read(msgs))

    async def read(self, msgs: list[Msg]) -> list[tuple[Msg, M]]:
        """Decode a fetched batch: settles at once what is not handled (skipped, malformed, buried)."""
        c = self.consumer
        decoded: list[tuple[Msg, M]] = []
        skipped = 0
        for m in msgs:
            try:
                if c.accepts is not None and not c.accepts(m.data):
                    skipped += 1  # counted once a batch: a consumer that skips most of a stream pays per message
                    await _ack(m)
                    continue
                if _deliveries(m) > c.max_deliver + CRASH_MARGIN:
                    await self._bury(m, DeadCause.EXHAUSTED, f"delivered {_deliveries(m)} times without an "
                                     "outcome (the consumer stopped while handling it each time)")
                    continue
                item = c.item(m)
                tracing.arrived(item, m.headers)  # each message continues its own trace in the handler
                decoded.append((m, item))
            except ContractError as exc:
                await self._malformed(m, exc.reason)
            except Exception as exc:  # noqa: BLE001 - a reader that cannot read it: refused like a malformed one
                await self._malformed(m, f"unreadable: {type(exc).__name__}: {exc}")
        if skipped:
            self._count("skipped", skipped)
        return decoded

    async def apply(self, decoded: list[tuple[Msg, M]]) -> None:
        """Handle a decoded batch and settle each of its messages; never raises (but for cancellation)."""
        if not decoded:
            return
        try:
            with logs.bound(**_fields(decoded)):
                await self._handle_while_unavailable(decoded)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - judged below, never lost
            if len(decoded) == 1:
                await self._failed(decoded[0][0], exc)
                return
            # One message may be at fault: apply each alone so the others go through.
            self.counters.isolated_batches += 1
            log.warning("%s: batch of %d failed (%s); applying each message alone", self.durable, len(decoded),
                        reason_of(exc))
            for m, item in decoded:
                await self._alone(m, item)
            return
        self._count("handled", len(decoded))
        for m, _ in decoded:
            await _ack(m)

    async def _handle_while_unavailable(self, decoded: list[tuple[Msg, M]]) -> None:
        """Apply the batch; while the database or bus is away, keep the messages and try again after a back-off."""
        attempt = 0
        while True:
            try:
                await self._handle(decoded)
                return
            except Exception as exc:
                if not is_unavailable(exc):
                    raise
                attempt += 1
                # Held messages stay ours only while their ack deadline is extended: sleep well inside it.
                delay = min(self.consumer.delay(attempt), self.consumer.ack_wait_seconds / 3)
                if attempt == 1 or attempt % 10 == 0:
                    log.warning("%s: unavailable (%r); holding %d message(s), next try in %.1fs", self.durable,
                                exc, len(decoded), delay)
                self.counters.waits += 1
                metrics.EDGE_WAITS.labels(self.reporter.name, self.durable).inc()
                for m in [m for m, _ in decoded] + fetched(self._ahead):  # still ours: extend the ack
                    with contextlib.suppress(Exception):                 # deadline, spend no delivery
                        await m.in_progress()
                await asyncio.sleep(delay)

    async def _alone(self, m: Msg, item: M) -> None:
        try:
            with logs.bound(**_fields([(m, item)])):
                await self._handle_while_unavailable([(m, item)])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - judged by _failed
            await self._failed(m, exc)
            return
        self._count("handled")
        await _ack(m)

    async def _failed(self, m: Msg, exc: BaseException) -> None:
        if is_permanent(exc):
            log.error("%s: message on %s can never be applied: %s", self.durable, m.subject, reason_of(exc))
            await self._bury(m, DeadCause.PERMANENT, reason_of(exc))
            return
        if _deliveries(m) >= self.consumer.max_deliver:
            log.error("%s: message on %s failed %d times, giving up: %s", self.durable, m.subject, _deliveries(m),
                      reason_of(exc))
            await self._bury(m, DeadCause.EXHAUSTED,
                             f"failed on each of {_deliveries(m)} deliveries; last: {reason_of(exc)}")
            return
        log.warning("%s: message on %s failed (delivery %d of %d), retrying: %s", self.durable, m.subject,
                    _deliveries(m), self.consumer.max_deliver, reason_of(exc),
                    exc_info=exc if _deliveries(m) == 1 else None)  # one traceback per message, not per delivery
        self._count("redelivered")
        with contextlib.suppress(MsgAlreadyAckdError, Exception):
            # Lost nak: AckWait redelivers it then.
            await m.nak(delay=self.consumer.delay(_deliveries(m)))

    async def _malformed(self, m: Msg, reason: str) -> None:
        self._count("malformed")
        if self.consumer.on_malformed is not None:
            try:
                await self.consumer.on_malformed(m.data, reason)
            except Exception as exc:  # noqa: BLE001 - the refusal below still happens
                log.warning("%s: answering a malformed message failed: %r", self.durable, exc)
        await self.reporter.reject(m.subject, m.data, reason)
        with contextlib.suppress(MsgAlreadyAckdError, Exception):
            await m.term()

    async def _bury(self, m: Msg, cause: DeadCause, reason: str) -> None:
        letter = dead_letter(service=self.reporter.name, consumer=self.durable, cause=cause, reason=reason,
                             subject=m.subject, payload=m.data, headers=dict(m.headers or {}),
                             deliveries=_deliveries(m), stream_seq=_stream_seq(m))
        try:
            await self.reporter.bury(letter)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - not buried, so not acked: it comes back, nothing lost
            log.warning("%s: dead letter not published (%r); the message stays", self.durable, exc)
            with contextlib.suppress(MsgAlreadyAckdError, Exception):
                await m.nak(delay=self.consumer.delay(_deliveries(m)))
            return
        self._count("dead")
        await _ack(m)


def _fields(decoded: list[tuple[Msg, Any]]) -> dict[str, str]:
    """What the log lines written while handling these messages are about (the ids they share)."""
    return logs.shared_fields([item for _, item in decoded], [getattr(m, "headers", None) for m, _ in decoded])


def fetched(ahead: asyncio.Task[list[Msg]] | None) -> list[Msg]:
    """The messages of the batch fetched ahead, once it has arrived (none before)."""
    if ahead is None or not ahead.done() or ahead.cancelled() or ahead.exception() is not None:
        return []
    return list(ahead.result())


async def _ack(m: Msg) -> None:
    # A lost ack means a redelivery, which every handler here applies idempotently.
    with contextlib.suppress(MsgAlreadyAckdError, Exception):
        await m.ack()
