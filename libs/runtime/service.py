"""What every service does at start and stop, in one place: connect to PostgreSQL and NATS, apply its
migrations, declare the streams, run its consumers as the subscribers of its FastStream app
(libs/runtime/edge_stream.py) and its singleton loops, refuse malformed messages visibly and bury the ones it gave
up on as dead letters.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from faststream import FastStream
from nats.aio.client import Client
from nats.js import JetStreamContext

from libs.contracts.dead import DeadLetter
from libs.contracts.envelope import RejectedMessage
from libs.contracts.subjects import Subjects

from . import bus, db, edge_stream, loophealth, metrics, tracing
from .clock import Clock
from .edge import Consumer, EdgeCounters
from .edge_loop import ConsumerLoop
from .edge_reply import Responder
from .observe import Observer
from .settings import CommonSettings
from .singleton import SingletonLoop
from .tasks import stop_tasks

log = logging.getLogger(__name__)

STOP_SECONDS = 15.0  # the most a stopping service waits for its subscribers, then for its pool's connections


@dataclass
class Runtime:
    name: str
    settings: CommonSettings
    pool: asyncpg.Pool
    nc: Client
    js: JetStreamContext
    clock: Clock = field(default_factory=Clock)
    tasks: list[asyncio.Task] = field(default_factory=list)
    rejected: int = 0
    dead: int = 0
    edge: EdgeCounters = field(default_factory=EdgeCounters)
    loops: list[ConsumerLoop] = field(default_factory=list)
    singletons: list[SingletonLoop] = field(default_factory=list)
    observer: Observer | None = None
    broker: edge_stream.EdgeBroker | None = None  # the service's FastStream broker, on ``nc`` (``consume``)
    app: FastStream | None = None
    loop_health: loophealth.LoopHealth = field(default_factory=loophealth.LoopHealth)

    @property
    def subjects(self) -> Subjects:
        return self.settings.subjects

    @classmethod
    async def open(cls, name: str, settings: CommonSettings, *, schema: str | None, package: str | None,
                   pool_size: int = 10) -> Runtime:
        """A returned pooled connection skips asyncpg's reset round trip (``db.rollback_only``): no service
        keeps session state on a pooled connection (locks are ``pg_advisory_xact_lock``, roles ``SET LOCAL``,
        LISTEN and leader locks have connections of their own; ``db.migrate`` undoes its session lock and role
        itself), so the reset, one round trip per borrowed connection, would undo nothing."""
        tracing.setup(name)  # spans exported as the OTEL_* variables say (nothing when none is set)
        pool = await db.create_pool(settings.database_url, max_size=pool_size,
                                    reset=db.rollback_only)
        if schema and package:
            await db.migrate(pool, schema, package)
        creds = settings.nats_credentials_file
        nc = await bus.connect(settings.nats_url, f"teto-{name}", credentials_file=creds)
        js = nc.jetstream(timeout=15.0)
        await bus.prepare_streams(js, settings.subjects, authenticated=creds is not None, role=name,
                                  replicas=settings.stream_replicas)
        runtime = cls(name=name, settings=settings, pool=pool, nc=nc, js=js)
        # Metrics endpoint, lag sampling and the answer to ``teto.rpc.status`` (docs/observability.md).
        runtime.observer = Observer(runtime)
        await runtime.observer.start()
        return runtime

    def singleton(self, lock_name: str, body: Callable[[], Awaitable[None]], retry_seconds: float = 1.0) -> None:
        loop = SingletonLoop(self.settings.database_url, f"{self.settings.subject_prefix}:{lock_name}", body,
                             retry_seconds=retry_seconds)
        self.singletons.append(loop)
        self.tasks.append(asyncio.create_task(loop.run(), name=lock_name, context=self._loop_context()))

    def background(self, coro: Awaitable[None], name: str) -> None:
        self.tasks.append(asyncio.create_task(coro, name=name, context=self._loop_context()))

    def _loop_context(self) -> contextvars.Context:
        """A task context whose periodic loops report to this runtime's ``loop_health`` (loophealth.py)."""
        ctx = contextvars.copy_context()
        ctx.run(loophealth.CURRENT.set, self.loop_health)
        return ctx

    async def consume(self, consumers: list[Consumer]) -> None:
        """Declare each consumer as a subscriber of the service's FastStream app and start them: every durable is
        bound before this returns (so the service is ready only once it receives), each then runs the edge's loop
        in its subscriber's task."""
        broker = await self.faststream()
        started = []
        for consumer in consumers:
            loop = ConsumerLoop(self.js, self.subjects, consumer, self, counters=self.edge)
            started.append(edge_stream.subscribe(broker, self.subjects, consumer, loop, service=self.name))
            self.loops.append(loop)
        for subscriber in started:
            await subscriber.start()

    async def provide(self, **values: Any) -> None:
        """Put the service's own objects (its store, counters, collaborators) in its broker's context, where its
        handlers' ``Context()`` parameters find them by name (libs/runtime/edge_stream.py), beside what every
        service has (``faststream``). Before ``consume``."""
        edge_stream.provide(await self.faststream(), **values)

    async def stop_consuming(self) -> None:
        """Stop the subscribers (a batch fetched ahead is handed back); the connection stays until ``close``."""
        if self.broker is not None:
            try:  # bounded: a stop that never ends would keep the service (and ``teto up``) from ever exiting
                await asyncio.wait_for(self.broker.stop(), STOP_SECONDS)
            except asyncio.TimeoutError:
                log.warning("%s: subscribers not stopped within %gs: closing anyway", self.name, STOP_SECONDS)
            except Exception:  # noqa: BLE001 - stopping: whatever the broker says, the connection closes next
                log.exception("%s: stopping the subscribers failed", self.name)
            self.broker = self.app = None

    async def faststream(self) -> edge_stream.EdgeBroker:
        """The service's FastStream broker and app (made once, on this runtime's connection), with a publisher
        declared for each message the service sends and, in its context, what every service's handlers may ask
        for: ``pool``, ``clock``, ``settings`` (the service's own), ``subjects`` and ``reporter`` (this runtime:
        refusals and dead letters)."""
        if self.broker is None:
            self.broker = edge_stream.EdgeBroker(self.nc, description=f"Teto {self.name}")
            self.app = edge_stream.service_app(self.name, self.broker)
            edge_stream.declare_publishers(self.broker, self.subjects, self.name)
            edge_stream.provide(self.broker, pool=self.pool, clock=self.clock, settings=self.settings,
                                subjects=self.subjects, reporter=self)
            await self.broker.connect()
        return self.broker

    async def respond(self, responders: list[Responder]) -> None:
        """Answer each responder's requests: core NATS subscribers of the service's FastStream app."""
        broker = await self.faststream()
        for responder in responders:
            await edge_stream.respond(broker, responder, self, service=self.name).start()

    async def bury(self, letter: DeadLetter) -> None:
        """Publish a dead letter and wait for JetStream's ack (raises if it could not be stored)."""
        msg_id = f"dead-{letter.consumer}-{letter.stream_seq}" if letter.stream_seq is not None else letter.id
        await bus.publish(self.js, self.subjects.dead(self.name), letter, msg_id=msg_id)
        self.dead += 1
        metrics.DEAD_LETTERS.labels(self.name, letter.consumer, letter.cause.value).inc()

    async def close(self) -> None:
        await stop_tasks(self.tasks)
        await self.stop_consuming()
        if self.observer is not None:
            await self.observer.stop()
        with contextlib.suppress(Exception):
            await self.nc.drain()
        with contextlib.suppress(Exception):
            await db.close_pool(self.pool, timeout=STOP_SECONDS)

    async def reject(self, subject: str, body: bytes, reason: str) -> None:
        """Log a refused message and publish it on ``teto.rejected.<service>`` where the audit log and operators
        see it (the consumer's edge terminates it: a malformed message is never redelivered)."""
        self.rejected += 1
        metrics.REJECTED.labels(self.name).inc()
        log.error("%s refused a message on %s: %s", self.name, subject, reason)
        # The excerpt is what a person reads: NUL and other C0 controls become U+FFFD so the note itself is
        # always storable and sendable, whatever the hostile message held.
        note = RejectedMessage(service=self.name, subject=_printable(subject)[:1000], reason=_printable(reason)[:4000],
                               payload_excerpt=_printable(body[:1000].decode("utf-8", "replace")),
                               payload_bytes=len(body))
        with contextlib.suppress(Exception):
            await bus.publish(self.js, self.subjects.rejected(self.name), note)


def _printable(text: str) -> str:
    return "".join(c if c >= " " or c in "\t\n" else "\ufffd" for c in text)


async def wait_forever() -> None:
    await asyncio.Event().wait()
