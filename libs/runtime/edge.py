"""The one way a Teto service consumes the bus: typed consumer declarations (here), run as FastStream batch pull
subscribers of the service's broker (``edge_stream.py``), and request/reply responders on core NATS
(``edge_reply.py``).

A ``Consumer`` names its subject, stream, durable, message model and handler. The handler gets a list of decoded
messages (a batch of one for a single-message consumer) and applies them, usually in one transaction. What happens
to each message is decided once for every service (``edge_settle.py``):
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

How batches are fetched (one ahead, lingering, the crash margin) is ``edge_loop.py``; docs/edge.md has the table.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import asyncpg
from nats.aio.msg import Msg

from libs.contracts import senders
from libs.contracts.dead import DeadLetter
from libs.contracts.envelope import Envelope

from .acksubject import stored_at as _stored_at

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
    # The message types this consumer reads, for the AsyncAPI document (docs/asyncapi.json); inferred from
    # ``decode`` (``Model.decode``) or a ``read`` built by ``from_sender``/``stamped`` when not given.
    contracts: tuple[type[Envelope], ...] = ()

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
    return _tagged(lambda m: read(m.subject, m.data), decode)


@dataclass(frozen=True)
class Stamped(Generic[M]):
    """A message with the time its stream stored it: when it was said, on the server's clock, whenever it is
    read (after an outage, a backlog is read long after)."""

    value: M
    stored_at: Any  # datetime | None (None: not a JetStream delivery)


def stamped(read: Callable[[Msg], M]) -> Callable[[Msg], Stamped[M]]:
    """A ``read`` that keeps the stream's time of each message beside it."""
    return _tagged(lambda m: Stamped(read(m), _stored_at(m)), read)


def _tagged(read: Callable[[Msg], Any], source: Callable[..., Any]) -> Callable[[Msg], Any]:
    read.contracts = contracts_of(source)  # type: ignore[attr-defined]
    return read


def contracts_of(reader: Callable[..., Any] | None) -> tuple[type[Envelope], ...]:
    """The message types a decoder or reader yields: ``Model.decode`` names its model; a reader made here carries
    what it wraps; a function may say it (``reader.contracts``)."""
    if reader is None:
        return ()
    owner = getattr(reader, "__self__", None)
    if isinstance(owner, type) and issubclass(owner, Envelope):
        return (owner,)
    return tuple(getattr(reader, "contracts", ()))


@dataclass
class EdgeCounters:
    handled: int = 0
    skipped: int = 0
    malformed: int = 0
    redelivered: int = 0
    dead: int = 0
    isolated_batches: int = 0
    waits: int = 0  # back-offs while the database or bus was away


def linger_before_next(fetched: int, batch: int, linger: float) -> float:
    """Seconds to wait before the next fetch: ``linger`` after a batch that came short (more may be on the way
    and would come as many small batches), none after a full one (a backlog) or an empty one (the next fetch waits
    for a first message anyway)."""
    return linger if 0 < fetched < batch else 0.0
