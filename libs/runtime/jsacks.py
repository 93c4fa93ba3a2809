"""JetStream publishes sent back to back, their acknowledgements awaited together.

nats-py's ``js.publish`` is a request: it sends one message and waits for the stream's acknowledgement before
the caller can send the next, so a relay of 500 messages pays 500 round trips and as many socket writes.
``AckPipe.send`` writes the message with a reply subject of its own (one wildcard subscription for all replies,
as nats-py's request multiplexer does) and returns a future of its acknowledgement; ``settle`` awaits many at once.
The messages leave in the order sent, on one connection, so the server receives and stores them in that order.

Unlike ``js.publish_async``, a send that fails (the payload over the server's limit, the connection closed)
leaves nothing waiting behind it, and a future that is given up on (``settle``'s timeout) is forgotten.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import Header
from nats.js.errors import APIError, NoStreamResponseError

_NO_RESPONDERS = "503"


def outcome_of(data: bytes, status: str | None) -> dict[str, Any] | BaseException:
    """What a JetStream publish reply says: the acknowledgement (stream, seq, duplicate) or the error."""
    if status == _NO_RESPONDERS:
        return NoStreamResponseError()
    try:
        resp = json.loads(data)
    except ValueError as exc:
        return APIError(description=f"unreadable publish acknowledgement: {exc}")
    if not isinstance(resp, dict):
        return APIError(description="unreadable publish acknowledgement")
    if "error" in resp:
        try:
            APIError.from_error(resp["error"])  # raises the error's class (bad request, not found, ...)
        except APIError as exc:
            return exc
        return APIError(description=str(resp["error"]))
    return resp


class AckPipe:
    """Pipelined JetStream publishes on one connection (one per relay; not for concurrent users' ordering)."""

    def __init__(self, js: JetStreamContext) -> None:
        self.nc: NATS = js._nc  # the context's own connection (nats-py keeps no public handle on it)
        self._prefix: str | None = None
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._seq = 0

    async def _inbox(self) -> str:
        if self._prefix is None:
            prefix = self.nc.new_inbox() + "."
            await self.nc.subscribe(prefix + "*", cb=self._on_reply)
            self._prefix = prefix
        return self._prefix

    async def _on_reply(self, msg: Msg) -> None:
        assert self._prefix is not None
        future = self._waiting.pop(msg.subject[len(self._prefix):], None)
        if future is None or future.done():
            return  # given up on (timed out) or answered twice
        status = msg.headers.get(Header.STATUS) if msg.headers else None
        result = outcome_of(msg.data, status)
        if isinstance(result, BaseException):
            future.set_exception(result)
        else:
            future.set_result(result)

    async def send(self, subject: str, payload: bytes,
                   headers: dict[str, str] | None) -> asyncio.Future[dict[str, Any]]:
        """Write one message (buffered by the client, in order) and return the future of its acknowledgement.
        Raises what the client raises before anything is sent (``MaxPayloadError``, a closed connection)."""
        prefix = await self._inbox()
        self._seq += 1
        token = str(self._seq)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[token] = future
        try:
            await self.nc.publish(subject, payload, reply=prefix + token, headers=headers)
        except BaseException:
            self._waiting.pop(token, None)
            raise
        future.add_done_callback(lambda _f: self._waiting.pop(token, None))
        return future

    async def settle(self, futures: Sequence[asyncio.Future[dict[str, Any]]],
                     timeout: float) -> list[BaseException | None]:
        """Wait up to ``timeout`` for all of them: for each, None (acknowledged) or why not (a timeout too)."""
        if futures:
            await asyncio.wait(futures, timeout=timeout)
        out: list[BaseException | None] = []
        for future in futures:
            if not future.done():
                future.cancel()  # forgotten: a late acknowledgement finds nothing waiting
                out.append(asyncio.TimeoutError(f"no publish acknowledgement within {timeout:g}s"))
            elif future.cancelled():
                out.append(asyncio.CancelledError())
            else:
                out.append(future.exception())
        return out

    @property
    def waiting(self) -> int:
        return len(self._waiting)
