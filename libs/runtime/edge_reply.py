"""The request/reply half of the edge (``edge.py`` is the consuming half): a ``Responder`` answers requests on a
core NATS subject in a queue group, one replica answering each. A request that fails its contract is refused
visibly (``Reporter.reject``) and answered with the responder's ``malformed`` reply; a handler that raises sends
no reply, and the requester asks again, as it would if this replica had died."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from nats.aio.client import Client
from nats.aio.msg import Msg

from libs.contracts.envelope import ContractError, Envelope

from . import logs
from .edge import Reporter
from .errors import reason_of

log = logging.getLogger(__name__)
M = TypeVar("M")


@dataclass(frozen=True)
class Responder(Generic[M]):
    """Answers requests on a core NATS subject in a queue group (one replica answers each request).

    ``malformed`` builds the reply to a request that fails its contract. A handler that raises sends no reply: the
    requester times out and asks again, as it would if this replica had died.
    """

    subject: str
    queue: str
    decode: Callable[[bytes], M]
    handle: Callable[[M], Awaitable[Envelope]]
    malformed: Callable[[str], Envelope]
    # Checks a decoded request against its subject (raises ContractError: refused like a malformed one), e.g.
    # that the executor named in the body is the one the subject names (libs/contracts/senders.py).
    bind: Callable[[str, M], None] | None = None


async def serve_responder(nc: Client, responder: Responder[M], reporter: Reporter) -> Any:
    """Answer on a plain nats-py subscription (a service's runtime declares its responders on its FastStream app
    instead: ``edge_stream.respond``)."""
    return await nc.subscribe(responder.subject, queue=responder.queue, cb=answerer(responder, reporter))


def answerer(responder: Responder[M], reporter: Reporter) -> Callable[[Msg], Awaitable[bytes | None]]:
    """What answers one request: refuse it (with the malformed reply), or answer with the handler's reply, or
    stay silent when the handler fails. Returns the reply sent (None: none), which FastStream's ``TestNatsBroker``
    hands its requester (on a real bus the reply goes to the request's inbox, here)."""

    async def on_request(msg: Msg) -> bytes | None:
        try:
            request = responder.decode(msg.data)
            if responder.bind is not None:
                responder.bind(msg.subject, request)
        except Exception as exc:  # noqa: BLE001 - a ContractError, or a decoder that could not read it at all
            reason = exc.reason if isinstance(exc, ContractError) else f"unreadable: {type(exc).__name__}: {exc}"
            await reporter.reject(msg.subject, msg.data, reason)
            reply = responder.malformed(reason)
        else:
            try:
                with logs.bound(**logs.shared_fields([request], [getattr(msg, "headers", None)])):
                    reply = await responder.handle(request)
            except Exception as exc:  # noqa: BLE001 - no answer is the honest answer; the requester retries
                log.warning("%s: request on %s failed: %s", reporter.name, msg.subject, reason_of(exc))
                return None
        body = reply.encode()
        if msg.reply:
            with contextlib.suppress(Exception):
                await msg.respond(body)
        return body

    return on_request
