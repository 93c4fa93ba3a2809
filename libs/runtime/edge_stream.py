"""Every Teto service is a FastStream app: one ``NatsBroker`` per service process, each ``Consumer`` declaration a
FastStream batch pull subscriber of it, each subject the service emits a declared publisher; the AsyncAPI document
(``teto/asyncapi.py``, docs/asyncapi.json) is FastStream's, generated from these declarations.

``EdgeSubscriber`` is FastStream's ``BatchPullStreamSubscriber`` with the edge's pull loop as its consuming task
(``edge_loop.ConsumerLoop.drive``: one fetch is one batch, one batch ahead, lingering, quick fetch) and the edge's
rules settling each message (``edge_settle.Settler``). A batch reaches its handler through FastStream's
``process_message``: the broker's middlewares, its context (``message``, ``logger``) and the declared handler run
as for any FastStream subscriber; what the handler's outcome means for each message (ack, hold, isolate, nak,
dead-letter) is the Settler's, so acknowledgement is ``AckPolicy.MANUAL`` here and FastStream's own logging is off
(the edge logs what it decided, once).

FastStream 0.7.8's own batch loop is not used: it fetches again until the batch is full or ``PullSub.timeout``
ran out, so a lone command would wait out the whole timeout before its handler saw it; it has no batch ahead and
no outage hold. The pull fetch patch (``natsfetch.install()``) is installed wherever a broker is built, for any
FastStream pull loop that does run (tests, tools).

A handler declares what it needs as FastStream does, with ``Context()`` (or ``Depends``) parameters after its batch:
``async def on_heartbeats(beats: list[Heartbeat], heartbeats: HeartbeatLog = Context(), clock: Clock = Context())``.
The service's runtime puts its pool, clock, settings, subjects and its own objects (a store, counters) in the
broker's context (``broker.context``, ``Runtime.provide``) at start; ``injected`` resolves them from there on each
call, with FastStream's injector (fast_depends, in-line rather than in worker threads) but without its casting: the
edge decoded and validated each message against its contract already, so a batch of a thousand is never validated
twice. (FastStream's own ``apply_types`` stays off: it would cast each batch with pydantic, and its model of the
declared handler is what the AsyncAPI document is made from.) ``on_malformed`` hooks and responders' handlers are
injected the same way.

In tests, FastStream's ``TestNatsBroker`` runs the same declarations with no server: its publish hands an
``EdgeSubscriber`` the raw message, which the edge's rules read, settle and hand to the handler as on a real bus
(``process_message``; ``edge_memory.py`` builds a service's broker for that tier).

``EdgeBroker`` shares the service's one NATS connection (``Runtime.nc``: its credentials, reconnect policy and
JetStream domain as ``bus.connect`` set them); stopping the broker stops its subscribers and leaves the connection
to the runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Union

from fast_depends.core import build_call_model
from faststream import AckPolicy, FastStream
from faststream.nats import JStream, NatsBroker, PullSub
from faststream.nats.message import NatsBatchMessage, NatsMessage
from faststream.nats.subscriber.usecases.stream_pull_subscriber import BatchPullStreamSubscriber
from faststream.response import ensure_response
from faststream.specification import AsyncAPI
from nats.aio.client import Client
from nats.aio.msg import Msg

from libs.contracts.envelope import Envelope
from libs.contracts.subjects import Subjects

from . import natsfetch
from .edge import Consumer, Reporter, contracts_of
from .edge_reply import Responder, answerer
from .edge_loop import consumer_config
from .edge_settle import Settler

log = logging.getLogger("libs.runtime.edge")

ASYNCAPI_VERSION = "3.0.0"


class EdgeSubscriber(BatchPullStreamSubscriber):
    """A FastStream batch pull subscriber whose consuming task is the edge's loop (see the module docstring)."""

    __slots__ = ()

    edge: Settler[Any]  # a ConsumerLoop on a real bus; a bare Settler under TestNatsBroker

    async def _create_subscription(self) -> None:
        """Bind the durable (retrying while JetStream is not ready), then start the edge's loop on it."""
        if self.subscription:
            return
        await self.edge.subscribe()
        self.subscription = self.edge._sub
        self.add_task(self._consume_pull)

    async def _consume_pull(self) -> None:
        await self.edge.drive(self.subscription)

    async def stop(self) -> None:
        """End the loop first and wait for it (the batch fetched ahead is handed back while the connection is
        still open), then let FastStream unsubscribe; the durable stays."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await super().stop()
        self.edge._sub = None

    async def deliver(self, decoded: list[tuple[Msg, Any]]) -> Any:
        """A decoded batch through FastStream: middlewares, context and the declared handler. Raises what the
        handler raised, for the Settler to judge."""
        return await BatchPullStreamSubscriber.process_message(self, decoded)

    async def process_message(self, msg: Any) -> Any:
        """What FastStream's ``TestNatsBroker`` delivers (a list of raw messages, no server behind them) goes through
        the edge's rules first, as a fetched batch does: read, refused if malformed, handed over, settled."""
        if isinstance(msg, list) and not (msg and isinstance(msg[0], tuple)):
            await self.edge.settle(msg)
            return ensure_response(None)
        return await BatchPullStreamSubscriber.process_message(self, msg)


async def _parse(decoded: list[tuple[Msg, Any]]) -> NatsBatchMessage:
    """The edge hands over messages it already read: the batch message carries them and their decoded values."""
    raw = [m for m, _ in decoded]
    headers = [m.headers or {} for m in raw]
    return NatsBatchMessage(raw_message=raw, body=[item for _, item in decoded], headers=headers[0] if headers else {},
                            batch_headers=headers)


async def _decode(message: NatsBatchMessage) -> list[Any]:
    return message.body


class EdgeBroker(NatsBroker):
    """A NatsBroker on a connection the runtime owns (see the module docstring)."""

    def __init__(self, connection: Client | None = None, *, description: str | None = None,
                 url: str = "nats://localhost:4222") -> None:
        natsfetch.install()
        # apply_types=False: handlers get the decoded batch as it is (the edge validated each message against its
        # contract) and their dependencies from ``injected``, never cast; the registered wrapper's annotation
        # declares the message types for AsyncAPI.
        super().__init__(url, logger=None, apply_types=False, description=description, graceful_timeout=None)
        self._shared = connection

    async def _connect(self) -> Client:
        if self._shared is None:
            return await super()._connect()
        self.config.connect(self._shared)
        return self._shared

    async def stop(self, *args: Any) -> None:
        if self._shared is not None:
            self._connection = None  # not ours to drain: the runtime closes it
        await super().stop(*args)


def service_app(name: str, broker: NatsBroker, description: str | None = None) -> FastStream:
    """The FastStream app of service ``name``; its AsyncAPI 3 document is ``app.schema.to_specification()``."""
    return FastStream(broker, specification=AsyncAPI(title=f"Teto {name}", version="1", description=description,
                                                     schema_version=ASYNCAPI_VERSION))


def injected(broker: NatsBroker, call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``call`` with the parameters it declares with ``Context()`` or ``Depends`` filled from ``broker.context`` on
    each call, the rest passed as they come (no casting: see the module docstring). A call that declares none is
    called as it is.

    fast_depends' own async path (``inject`` on a coroutine function) runs every synchronous resolver, each
    ``Context()`` among them, in a worker thread: 0.6 ms a batch for three dependencies, whatever its size (more
    than FastStream's whole dispatch). Its synchronous path resolves the same declarations in-line, so the call
    model is built of a synchronous twin of ``call`` (same parameters) that returns ``call``'s coroutine: the
    dependencies are FastStream's, resolved by fast_depends, in this task. A ``Depends`` provider is therefore a
    plain function (its own ``Context()`` parameters are resolved too); fast_depends refuses a coroutine function
    there when the handler is declared ("cannot use async dependency")."""
    signature = inspect.signature(call)
    # Annotations do not matter here (nothing is cast; a ``Context()`` is found by name): left out, so a type only
    # imported for checking never has to be resolved.
    params = [p.replace(annotation=inspect.Parameter.empty) for p in signature.parameters.values()]

    def twin(*args: Any, **kwargs: Any) -> Awaitable[Any]:
        return call(*args, **kwargs)

    twin.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=params, return_annotation=inspect.Parameter.empty)
    model = build_call_model(twin, dependency_provider=broker.provider, serializer_cls=None)
    if not model.dependencies and not model.custom_fields and not model.extra_dependencies:
        return call
    context = broker.context

    async def resolved(*args: Any) -> Any:
        with contextlib.ExitStack() as stack:
            return await model.solve(*args, stack=stack, cache_dependencies={}, context__=context)

    return resolved


def provide(broker: NatsBroker, **values: Any) -> None:
    """Put ``values`` in ``broker``'s context under their names, for the handlers that ask for them."""
    for name, value in values.items():
        broker.context.set_global(name, value)


def subscribe(broker: NatsBroker, subjects: Subjects, consumer: Consumer[Any], loop: Settler[Any] | None,
              *, service: str = "") -> EdgeSubscriber:
    """Declare ``consumer`` on ``broker`` as a batch pull subscriber whose batches ``loop`` settles (a ConsumerLoop
    fetches them; a bare Settler gets them from ``TestNatsBroker``; None: declared for the AsyncAPI document only).
    Its handler and ``on_malformed`` get their dependencies from the broker's context."""
    c = consumer
    stream = subjects.stream_name(c.stream)
    models = c.contracts or contracts_of(c.decode) or contracts_of(c.read) or _catalogue(subjects, c)
    sub = broker.subscriber(c.subject, stream=JStream(stream, declare=False), durable=c.durable,
                            config=consumer_config(c), pull_sub=PullSub(c.batch, c.wait_seconds, batch=True),
                            ack_policy=AckPolicy.MANUAL, parser=_parse, decoder=_decode, title=c.durable,
                            description=f"{service + ': ' if service else ''}durable `{c.durable}` on stream "
                                        f"`{stream}`, batches of up to {c.batch}")
    # FastStream builds its own batch subscriber; ours is the same object with the edge's loop (no new state).
    sub.__class__ = EdgeSubscriber
    sub(_handler(c, models, injected(broker, c.handle) if loop is not None else c.handle))
    if loop is not None:
        sub.edge = loop
        loop.deliver = sub.deliver
        if c.on_malformed is not None:
            loop.consumer = dataclasses.replace(c, on_malformed=injected(broker, c.on_malformed))
    return sub  # type: ignore[return-value]


def publish(broker: NatsBroker, subject: str, stream: str | None, models: Sequence[type[Envelope]], *,
            title: str, description: str) -> Any:
    """Declare a subject the service emits (its outbox relay or its responder publishes it with nats-py)."""
    schema: Any = models[0] if len(models) == 1 else Union[tuple(models)]  # noqa: UP007 - a runtime union
    where = f"stream `{stream}`" if stream else "core NATS (request/reply)"
    return broker.publisher(subject, schema=schema, title=title, description=f"{description}; {where}")


def respond(broker: NatsBroker, responder: Responder[Any], reporter: Reporter | None, *, service: str = "") -> Any:
    """Declare ``responder`` on ``broker`` as a core NATS subscriber in its queue group, answering as
    ``edge_reply.answerer`` does (``reporter`` None: declared for the AsyncAPI document only)."""
    model = getattr(responder.decode, "__self__", None)
    sub = broker.subscriber(responder.subject, queue=responder.queue, parser=raw_parser, decoder=raw_decoder,
                            no_reply=True, ack_policy=AckPolicy.MANUAL,  # see ``raw_parser``
                            title=responder_title(service, responder),
                            description=f"{service}: answers requests on core NATS (request/reply, queue group "
                                        f"`{responder.queue}`), not stored in a stream")
    answer = (answerer(dataclasses.replace(responder, handle=injected(broker, responder.handle)), reporter)
              if reporter is not None else None)

    async def handle(request: Any) -> bytes | None:
        return await answer(request) if answer is not None else None

    handle.__annotations__ = {"request": model if model is not None else Envelope}
    handle.__name__ = handle.__qualname__ = f"{service}_rpc_{responder.queue}"
    sub(handle)
    return sub


def listen(broker: NatsBroker, subject: str, on_message: Callable[[Msg], Awaitable[Any]] | None, *, title: str,
           description: str, model: Any) -> Any:
    """Declare a plain core NATS subscription (every replica gets every message) on ``broker``: ``on_message`` gets
    each nats-py message as it is, and its dependencies from the broker's context (None: declared for the AsyncAPI
    document only)."""
    sub = broker.subscriber(subject, parser=raw_parser, decoder=raw_decoder, no_reply=True,
                            ack_policy=AckPolicy.MANUAL, title=title,  # see ``raw_parser``
                            description=description)

    call = injected(broker, on_message) if on_message is not None else None

    async def handle(message: Any) -> None:
        if call is not None:
            await call(message)

    handle.__annotations__ = {"message": model}
    handle.__name__ = handle.__qualname__ = title.replace("-", "_")
    sub(handle)
    return sub


def responder_title(service: str, responder: Responder[Any]) -> str:
    """``queue:teto.rpc.lease.renew``: the operation answering a responder's requests (a key that needs no
    escaping in a JSON pointer)."""
    return f"{service}:{responder.subject.removesuffix('.*')}"


async def raw_parser(msg: Msg) -> NatsMessage:
    """A core NATS message for a subscriber that reads and answers it itself. Such a subscriber is declared with
    ``no_reply=True`` and ``AckPolicy.MANUAL``: FastStream would otherwise "acknowledge" it after the handler, and
    acknowledging a core message publishes to its reply subject (a second answer to a request, which the bus
    refuses a part that may answer once; or, on a message a JetStream publish sent, a stray reply to the
    publisher's acknowledgement inbox)."""
    return NatsMessage(raw_message=msg, body=msg.data, reply_to=msg.reply or "", headers=msg.headers or {})


async def raw_decoder(message: NatsMessage) -> Msg:
    """A responder reads and answers the request itself (its contract, its sender, its reply)."""
    return message.raw_message


def declare_publishers(broker: NatsBroker, subjects: Subjects, part: str | None = None) -> list[Any]:
    """A publisher for each message the catalogue (libs/contracts/registry.py) says ``part`` publishes (every part's
    when None): the subjects its outbox relay, responders and refusals send on, with their contracts."""
    from libs.contracts.registry import CATALOGUE

    declared = []
    for entry in CATALOGUE:
        if part is not None and not publishes(entry.publisher, part):
            continue
        stream = subjects.stream_name(entry.stream) if entry.stream else None
        declared.append(publish(broker, address(entry.subject, subjects), stream, [entry.model],
                                title=f"{entry.model.SCHEMA} from {entry.publisher}",
                                description=f"{entry.description} (published by {entry.publisher})"))
    return declared


def publishes(publisher: str, part: str) -> bool:
    """Whether the catalogue's ``publisher`` column names ``part`` (``queue, gateway``; ``any consumer``: every
    service; ``owning service``: the services that decide commands)."""
    named = {p.strip() for p in publisher.split(",")}
    return part in named or "any consumer" in named or (publisher == "owning service" and part in DECIDERS) \
        or "every service replica" in named


DECIDERS = frozenset({"queue", "health"})  # the services that answer commands with an outcome


def address(pattern: str, subjects: Subjects) -> str:
    """``teto.job.<job_id>.<event>`` as an AsyncAPI address (``{job_id}``), in ``subjects``' prefix; a reply goes
    to the requester's inbox."""
    if not pattern.startswith("teto."):
        return "_INBOX.{inbox}"
    return subjects.prefix + pattern[len("teto"):].replace("<", "{").replace(">", "}")


def _handler(c: Consumer[Any], models: Iterable[type[Envelope]], call: Callable[[Any], Awaitable[Any]]) -> Any:
    async def handle(batch: Any) -> Any:
        return await call(batch)

    types = tuple(models)
    # One NATS message is one of these (the handler gets a list of them): the AsyncAPI message payload.
    handle.__annotations__ = {"batch": types[0] if len(types) == 1 else Union[types] if types else Any}  # noqa: UP007
    handle.__name__ = handle.__qualname__ = c.durable.replace("-", "_")
    handle.__doc__ = f"The handler of durable {c.durable} (its batch, in stream order)."
    return handle


def _catalogue(subjects: Subjects, c: Consumer[Any]) -> tuple[type[Envelope], ...]:
    """The message types the catalogue (libs/contracts/registry.py) lists on this consumer's stream and subject."""
    from libs.contracts.registry import CATALOGUE

    prefix = c.subject.replace(subjects.prefix, "teto", 1).split(".*")[0].split(".>")[0]
    return tuple(dict.fromkeys(e.model for e in CATALOGUE if e.stream == c.stream and e.subject.startswith(prefix)))
