"""The in-memory tier of the edge: a service's real declarations (its consumers, their handlers, its responders)
on a broker that FastStream's ``TestNatsBroker`` runs with no server. A message published there is read, refused,
handed to its handler and settled by the edge's rules as on the bus (``edge_settle.Settler``, through
``EdgeSubscriber.process_message``); the handler's dependencies come from the broker's context as in the service,
so a test puts a fake clock or a database-less store double there instead of the real ones.

    broker, reporter = memory_broker("budget", subjects, consumers(subjects, settings), ledger=FakeLedger(), ...)
    async with TestNatsBroker(broker) as bus:
        await bus.publish(report.encode(), subjects.usage("ex-1"))

The real-broker tier (a nats-server and PostgreSQL, tests/integration) runs the same declarations with the
runtime's own context (``Runtime.faststream``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from libs.contracts.dead import DeadLetter
from libs.contracts.subjects import Subjects

from .edge import Consumer, EdgeCounters
from .edge_reply import Responder
from .edge_settle import Settler
from .edge_stream import EdgeBroker, provide, respond, subscribe


@dataclass
class MemoryReporter:
    """Where the in-memory tier's refusals and dead letters go: kept, for the test to read."""

    name: str
    rejected: list[tuple[str, bytes, str]] = field(default_factory=list)  # (subject, body, reason)
    dead: list[DeadLetter] = field(default_factory=list)
    counters: EdgeCounters = field(default_factory=EdgeCounters)

    async def reject(self, subject: str, body: bytes, reason: str) -> None:
        self.rejected.append((subject, body, reason))

    async def bury(self, letter: DeadLetter) -> None:
        self.dead.append(letter)


def memory_broker(service: str, subjects: Subjects, consumers: Iterable[Consumer[Any]],
                  responders: Iterable[Responder[Any]] = (), **context: Any) -> tuple[EdgeBroker, MemoryReporter]:
    """``service``'s consumers and responders declared on a broker for ``TestNatsBroker``, each consumer's batches
    settled by the edge's rules, with ``context`` (and ``subjects`` and ``reporter``, the returned one) in the
    broker's context for the handlers."""
    broker = EdgeBroker(description=f"Teto {service} (in memory)")
    reporter = MemoryReporter(service)
    for consumer in consumers:
        subscribe(broker, subjects, consumer, Settler(None, subjects, consumer, reporter, counters=reporter.counters),
                  service=service)
    for responder in responders:
        respond(broker, responder, reporter, service=service)
    provide(broker, subjects=subjects, reporter=reporter, **context)
    return broker, reporter
