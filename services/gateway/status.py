"""Gathering ``GET /v1/status``: every service replica's answer to ``teto.rpc.status`` (collected for
``status_wait_seconds``), each NATS member's client port (the INFO a server sends first), each stream's info from
JetStream (replicas, leader, peers), a database probe and the executors' public view. The verdicts are
services/gateway/domain/status.py's.

Every part is asked at once, each with its own timeout (``status_part_timeout_seconds``): a part that fails or
does not answer in time is that part's problem, named in the answer, and never the answer's failure. So the
answer comes back within about the larger of the two settings whatever is down, and shows the loss while it
lasts (a member killed: its probe refused, its streams electing leaders, the replicas connected to it moving).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlsplit

from nats.js.errors import NotFoundError

from libs.contracts.envelope import ContractError
from libs.contracts.status import ReplicaStatus, StatusRequest
from libs.runtime.natsauth import SERVICES

from .domain.status import (BusView, DatabaseView, MemberProbe, Peer, Seen, Status, StreamFailure, StreamView,
                            remember, summarize)

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_NATS_PORT = 4222


def failure(exc: BaseException) -> str:
    """One line naming a part's failure (a timeout has no message of its own)."""
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return "no answer in time"
    return f"{type(exc).__name__}: {exc}".rstrip(": ")[:300]


def member_address(url: str) -> tuple[str, int, str]:
    """(host, port, the URL as shown: without credentials) of one entry of ``TETO_NATS_URL``."""
    parts = urlsplit(url if "://" in url else f"nats://{url}")
    host, port = parts.hostname or "127.0.0.1", parts.port or DEFAULT_NATS_PORT
    return host, port, f"{parts.scheme}://{host}:{port}"


async def server_info(host: str, port: int) -> dict[str, Any]:
    """The INFO a NATS server writes first on its client port (before TLS or authentication): whether the member
    is up, and its ``server_name``."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        line = await reader.readline()
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    if not line.startswith(b"INFO "):
        raise ConnectionError(f"not a NATS server: {line[:40]!r}")
    return json.loads(line[5:])


class StatusGatherer:
    def __init__(self, runtime: Any, reads: Any, wait_seconds: float, part_timeout: float = 1.5,
                 forget_seconds: float = 120.0) -> None:
        self.runtime = runtime
        self.reads = reads
        self.wait_seconds = wait_seconds
        self.part_timeout = part_timeout
        self.forget_seconds = forget_seconds
        self.seen: dict[tuple[str, str], Seen] = {}  # the replicas earlier answers included
        self.member_names: dict[str, str] = {}  # member URL -> server name, from earlier probes

    async def status(self) -> Status:
        nc = self.runtime.nc
        connected = bool(nc.is_connected)
        replies, probes, streams, db, executors = await asyncio.gather(
            self.replicas() if connected else _none(), self.members(), self.streams() if connected else _none(),
            self.database(), self.part(self.reads.executors()))
        info = (getattr(nc, "_server_info", None) or {}) if connected else {}
        found, failed = streams or ((), ())
        bus = BusView(info.get("server_name"), info.get("cluster"), found, failed=failed, probes=probes,
                      error=None if connected else "the gateway is not connected to NATS (reconnecting)")
        now = datetime.now(UTC)
        status = summarize(replies, bus, db, executors if not isinstance(executors, BaseException)
                           else failure(executors), expected=SERVICES, seen=self.seen, now=now)
        if replies is not None:
            self.seen = remember(self.seen, replies, now, self.forget_seconds)
        return status

    async def part(self, awaitable: Awaitable[T]) -> T | BaseException:
        """One part with its own timeout: its result, or the exception that ended it (never raised)."""
        try:
            return await asyncio.wait_for(awaitable, self.part_timeout)
        except Exception as exc:  # noqa: BLE001 - a part's failure is reported, not raised
            return exc

    async def replicas(self) -> list[ReplicaStatus]:
        """Ask once, keep every answer that arrives within the window (one per live replica)."""
        nc = self.runtime.nc
        inbox = nc.new_inbox()
        answers: list[ReplicaStatus] = []

        async def on_reply(msg) -> None:
            if not msg.data:  # the server's "no responders" (no replica subscribed at all)
                return
            try:
                answers.append(ReplicaStatus.decode(msg.data))
            except ContractError as exc:
                log.warning("status: unreadable reply: %s", exc.reason)

        try:
            sub = await nc.subscribe(inbox, cb=on_reply)
        except Exception as exc:  # noqa: BLE001 - the connection went meanwhile: nobody can answer
            log.warning("status: cannot ask the replicas: %r", exc)
            return answers
        try:
            await nc.publish(self.runtime.subjects.rpc_status, StatusRequest().encode(), reply=inbox)
            await asyncio.sleep(self.wait_seconds)
        except Exception as exc:  # noqa: BLE001 - as above: the answers so far are the answer
            log.warning("status: cannot ask the replicas: %r", exc)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return answers

    async def members(self) -> tuple[MemberProbe, ...]:
        """Every member of ``TETO_NATS_URL`` probed on its client port at once."""
        urls = [u.strip() for u in self.runtime.settings.nats_url.split(",") if u.strip()]
        return tuple(await asyncio.gather(*(self._member(u) for u in urls)))

    async def _member(self, url: str) -> MemberProbe:
        host, port, shown = member_address(url)
        info = await self.part(server_info(host, port))
        if isinstance(info, BaseException):
            return MemberProbe(shown, self.member_names.get(shown), failure(info))
        name = info.get("server_name") or info.get("server_id")
        if name:
            self.member_names[shown] = name
        return MemberProbe(shown, name)

    async def streams(self) -> tuple[tuple[StreamView, ...], tuple[StreamFailure, ...]]:
        specs = list(self.runtime.subjects.streams())
        answers = await asyncio.gather(*(self.part(self._stream(spec.name)) for spec in specs))
        found = tuple(a for a in answers if isinstance(a, StreamView))
        failed = tuple(StreamFailure(spec.name, failure(a)) for spec, a in zip(specs, answers, strict=True)
                       if isinstance(a, BaseException))
        return found, failed

    async def _stream(self, name: str) -> StreamView | None:
        try:
            info = await self.runtime.nc.jetstream(timeout=self.part_timeout).stream_info(name)
        except NotFoundError:  # not declared (yet): not the bus being down
            return None
        cluster = info.cluster
        peers = tuple(Peer(p.name or "?", bool(p.current), bool(p.offline), int(p.lag or 0))
                      for p in (cluster.replicas or [])) if cluster else ()
        return StreamView(name, int(info.config.num_replicas or 1), int(info.state.messages or 0),
                          cluster.leader if cluster else None, peers)

    async def database(self) -> DatabaseView:
        started = time.perf_counter()
        answer = await self.part(self.runtime.pool.fetchval("SELECT 1"))
        if isinstance(answer, BaseException):
            return DatabaseView(False, error=failure(answer))
        return DatabaseView(True, round((time.perf_counter() - started) * 1000, 2))


async def _none() -> None:
    return None
