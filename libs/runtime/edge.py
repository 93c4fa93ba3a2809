"""The one way a Teto service consumes the bus: typed consumer declarations run on durable pull consumers (here),
and request/reply responders on core NATS (``edge_reply.py``).

A ``Consumer`` names its subject, stream, durable, message model and handler. The handler gets a list of decoded
messages (a batch of one for a single-message consumer) and applies them, usually in one transaction. What happens
to each message is decided here, once for every service:
- other schemas on a shared subject (``accepts`` says no): acknowledged unread;
- malformed (fails its contract): refused visibly on ``teto.rejected.<service>`` (audited) and terminated;
- the handler returned: acknowledged;
- the handler raised while the bus or the database is away (``is_unavailable``): the batch is kept (its ack
  deadline extended) and applied again after a back-off, in this process, until the world is back; nobody's
  message is blamed and no delivery is spent, so a long outage dead-letters nothing;
- any other failure is isolated: each message of the batch is applied alone, so one bad message never holds back
  the others. A message that fails alone and permanently (``errors.is_permanent``) is dead-lettered at once; one
  that fails transiently is redelivered with back-off until ``max_deliver`` deliveries, then dead-lettered.
Dead letters go to ``teto.dead.<service>`` with the reason, the original subject, headers and payload; only once
that publish is acknowledged is the original acknowledged, so nothing accepted is lost.

One batch is fetched ahead: while a batch is handled, the next one is on its way (``run``). Batches are still
handled one at a time in the order fetched, so one executor's heartbeats and one job's reports are applied in
stream order as before; a held batch (outage) keeps the batch behind it too, and at shutdown a batch fetched but
not handled is handed back at once (nak). Acknowledgements are plain publishes (no reply awaited), after the
handler succeeded.

Why our own pull loop and not FastStream's subscribers (faststream 0.7.8 with nats-py 2.16): FastStream's
multi-message pull loop catches only ``nats.errors.TimeoutError``, while nats-py raises a plain
``asyncio.TimeoutError`` when its own timer fires first; the loop task dies and its fetched messages wait out the
AckWait. One message per fetch avoids that but caps a consumer near 440 msg/s. Here one ``fetch`` is one batch,
handled at once (docs/reliability.md; regression test in tests/integration/test_edge.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import asyncpg
from nats.aio.msg import Msg
from nats.errors import MsgAlreadyAckdError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig

from libs.contracts.dead import DeadCause, DeadLetter, dead_letter
from libs.contracts import senders
from libs.contracts.envelope import ContractError, Envelope
from libs.contracts.subjects import Subjects

from . import logs, metrics, quickfetch, tracing
from .acksubject import deliveries as _deliveries, stored_at as _stored_at, stream_seq as _stream_seq
from .errors import is_permanent, reason_of

log = logging.getLogger(__name__)
M = TypeVar("M")

DEFAULT_MAX_DELIVER = 8
DEFAULT_BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
# A message delivered this many times more than the limit never got an outcome: the consumer died on it each
# time (a crash, an OOM kill). It is buried before being handled again, so it cannot kill every replica forever.
CRASH_MARGIN = 3
# The server's own max_deliver, a last resort far past the edge's limit: the edge buries a message long before
# it (an outage holds messages without spending deliveries), so the server stops only one the edge could not
# even bury (the bus refusing the dead letter over and over); JetStream then raises its max-deliveries advisory.
SERVER_MAX_DELIVER_FACTOR = 4


class Reporter(Protocol):
    """Where refusals and dead letters go (the service's Runtime)."""

    name: str

    async def reject(self, subject: str, body: bytes, reason: str) -> None: ...

    async def bury(self, letter: DeadLetter) -> None: ...


def is_unavailable(exc: BaseException) -> bool:
    """The world is not ready (database or bus away): nobody's message is at fault, redeliver them all."""
    return isinstance(exc, (OSError, asyncio.TimeoutError, TimeoutError, asyncpg.InterfaceError,
                            asyncpg.CannotConnectNowError, asyncpg.ConnectionDoesNotExistError,
                            asyncpg.TooManyConnectionsError, asyncpg.AdminShutdownError,
                            asyncpg.InsufficientResourcesError, asyncpg.ConnectionFailureError))


@dataclass(frozen=True)
class Consumer(Generic[M]):
    """A durable pull consumer of ``subject`` in stream ``stream`` (base name), shared by every replica."""

    subject: str
    stream: str
    durable: str
    decode: Callable[[bytes], M] | None  # raises ContractError for a malformed message (None: see ``read``)
    handle: Callable[[list[M]], Awaitable[Any]]
    batch: int = 200
    accepts: Callable[[bytes], bool] | None = None  # False: another schema on a shared subject, acked unread
    on_malformed: Callable[[bytes, str], Awaitable[Any]] | None = None  # e.g. answer a malformed command
    read: Callable[[Msg], M] | None = None  # instead of decode, for a consumer that needs subject and sequence
    max_deliver: int = DEFAULT_MAX_DELIVER
    backoff: Sequence[float] = DEFAULT_BACKOFF
    wait_seconds: float = 0.5  # how long a fetch waits for the first message
    # How long messages fetched by a replica that died wait before another replica gets them.
    ack_wait_seconds: float = 15.0
    # Read the batch fetched ahead while this one is handled (a costly reader); still handled one at a time, in order.
    read_ahead: bool = False
    # After a batch shorter than ``batch``, wait this long before fetching the next, so what arrives meanwhile comes
    # as one batch (one transaction) instead of many small ones: for consumers nobody waits on (the audit log, the
    # budget's and health's job events), where each transaction's fixed cost dominates at moderate rates. A full
    # batch is followed at once (a backlog drains at full speed); 0 (the default): fetch at once.
    linger_seconds: float = 0.0

    def __post_init__(self) -> None:
        if (self.decode is None) == (self.read is None):
            raise ValueError(f"{self.durable}: give a consumer either decode or read")

    def item(self, m: Msg) -> M:
        return self.read(m) if self.read is not None else self.decode(m.data)  # type: ignore[misc]

    def delay(self, deliveries: int) -> float:
        """Back-off before the next delivery, after ``deliveries`` failed ones."""
        steps = list(self.backoff) or [1.0]
        return steps[min(max(deliveries, 1), len(steps)) - 1]


def model_decoder(model: type[Envelope]) -> Callable[[bytes], Envelope]:
    return model.decode


def from_sender(decode: Callable[[bytes], M]) -> Callable[[Msg], M]:
    """A ``read`` for an executor's report: decode it and refuse it (as malformed: rejected visibly) when the
    body claims another executor than the subject's sender token (libs/contracts/senders.py)."""
    read = senders.bound(decode)
    return lambda m: read(m.subject, m.data)


@dataclass(frozen=True)
class Stamped(Generic[M]):
    """A message with the time its stream stored it: when it was said, on the server's clock, whenever it is
    read (after an outage, a backlog is read long after)."""

    value: M
    stored_at: Any  # datetime | None (None: not a JetStream delivery)


def stamped(read: Callable[[Msg], M]) -> Callable[[Msg], Stamped[M]]:
    """A ``read`` that keeps the stream's time of each message beside it."""
    return lambda m: Stamped(read(m), _stored_at(m))


@dataclass
class EdgeCounters:
    handled: int = 0
    skipped: int = 0
    malformed: int = 0
    redelivered: int = 0
    dead: int = 0
    isolated_batches: int = 0
    waits: int = 0  # back-offs while the database or bus was away


@dataclass
class ConsumerLoop(Generic[M]):
    """Runs one Consumer: fetch a batch, decode, handle, settle each message (see the module docstring)."""

    js: JetStreamContext
    subjects: Subjects
    consumer: Consumer[M]
    reporter: Reporter
    counters: EdgeCounters = field(default_factory=EdgeCounters)
    retry_seconds: float = 1.0
    _sub: JetStreamContext.PullSubscription | None = None
    _ahead: asyncio.Task[list[Msg]] | None = None  # the next batch, fetched while this one is handled

    @property
    def durable(self) -> str:
        return self.consumer.durable

    def _count(self, outcome: str, n: int = 1) -> None:
        """One place for what the edge did: the in-process counters (tests) and the exported series."""
        setattr(self.counters, outcome, getattr(self.counters, outcome) + n)
        metrics.EDGE_MESSAGES.labels(self.reporter.name, self.durable, self.consumer.stream, outcome).inc(n)

    async def subscribe(self) -> None:
        """Create or bind the durable (before the service says it is ready)."""
        if self._sub is not None:
            return
        c = self.consumer
        config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=c.ack_wait_seconds,
                                max_deliver=SERVER_MAX_DELIVER_FACTOR * (c.max_deliver + CRASH_MARGIN),
                                max_ack_pending=max(1000, 4 * c.batch))
        while True:
            try:
                self._sub = await self.js.pull_subscribe(c.subject, durable=c.durable,
                                                         stream=self.subjects.stream_name(c.stream), config=config)
                if not quickfetch.quicken(self._sub):  # a message already arrived costs no task (quickfetch.py)
                    log.warning("%s: nats-py's subscription is not the one quickfetch knows; fetching as is",
                                c.durable)
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - JetStream not ready yet (a leader election, say)
                log.warning("%s: cannot subscribe (%r); retrying", c.durable, exc)
                await asyncio.sleep(self.retry_seconds)

    async def run(self) -> None:
        """Fetch and settle batches until cancelled. The next batch is fetched while the current one is handled
        (one batch ahead): handling stays one batch at a time in stream order, so per-executor and per-job order
        is what it was without the prefetch; only the wait for the broker overlaps the handler's work. With
        ``read_ahead`` the batch ahead is also read meanwhile, and the one after it fetched once this one settled."""
        await self.subscribe()
        sub, read_ahead = self._sub, self.consumer.read_ahead
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
            # An open pull request would hold the connection's drain at shutdown; the durable stays.
            self._sub = None
            await _give_back(ahead, applying)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _logged(self, work: Awaitable[Any]) -> Any:
        try:  # reading or handling a batch
            return await work
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a bug here must not end the consumer: its messages come back
            log.exception("%s: settling a batch failed; its unsettled messages return after the ack wait", self.durable)
            return None

    async def _fetch(self, sub: JetStreamContext.PullSubscription, linger: float = 0.0) -> list[Msg]:
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

    # -- one batch ------------------------------------------------------------------------------------------

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
                await self.consumer.handle([item for _, item in decoded])
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
                for m in [m for m, _ in decoded] + _fetched(self._ahead):  # still ours: extend the ack
                    with contextlib.suppress(Exception):                  # deadline, spend no delivery
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


def linger_before_next(fetched: int, batch: int, linger: float) -> float:
    """Seconds to wait before the next fetch: ``linger`` after a batch that came short (more may be on the way
    and would come as many small batches), none after a full one (a backlog) or an empty one (the next fetch waits
    for a first message anyway)."""
    return linger if 0 < fetched < batch else 0.0


def _fetched(ahead: asyncio.Task[list[Msg]] | None) -> list[Msg]:
    """The messages of the batch fetched ahead, once it has arrived (none before)."""
    if ahead is None or not ahead.done() or ahead.cancelled() or ahead.exception() is not None:
        return []
    return list(ahead.result())


async def _give_back(ahead: asyncio.Task[list[Msg]], applying: asyncio.Task[None] | None = None) -> None:
    """At shutdown: stop the batch being handled (read ahead) and the fetch ahead; a batch that already arrived is
    handed back at once (nak without delay) for another replica, instead of waiting out its ack wait. Never raises."""
    for task in filter(None, (applying, ahead)):
        task.cancel()  # no-op when done
        with contextlib.suppress(BaseException):
            await task
    for m in _fetched(ahead):
        with contextlib.suppress(MsgAlreadyAckdError, Exception):
            await m.nak()


async def _ack(m: Msg) -> None:
    # A lost ack means a redelivery, which every handler here applies idempotently.
    with contextlib.suppress(MsgAlreadyAckdError, Exception):
        await m.ack()
