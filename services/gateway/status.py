"""Gathering ``GET /v1/status``: every service replica's answer to ``teto.rpc.status`` (collected for
``status_wait_seconds``), each stream's info from JetStream (replicas, leader, peers), a database probe and the
executors' public view. The verdicts are services/gateway/domain/status.py's."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from nats.js.errors import NotFoundError

from libs.contracts.envelope import ContractError
from libs.contracts.status import ReplicaStatus, StatusRequest
from libs.runtime.natsauth import SERVICES

from .domain.status import BusView, DatabaseView, Peer, Status, StreamView, summarize

log = logging.getLogger(__name__)
PROBE_TIMEOUT_SECONDS = 5.0


class StatusGatherer:
    def __init__(self, runtime: Any, reads: Any, wait_seconds: float) -> None:
        self.runtime = runtime
        self.reads = reads
        self.wait_seconds = wait_seconds

    async def status(self) -> Status:
        replies, bus, db = await asyncio.gather(self.replicas(), self.bus(), self.database())
        try:
            executors = await self.reads.executors()
        except Exception as exc:  # noqa: BLE001 - the database probe above says why
            log.warning("status: executors unreadable: %r", exc)
            executors = []
        return summarize(replies, bus, db, executors, expected=SERVICES)

    async def replicas(self) -> list[ReplicaStatus]:
        """Ask once, keep every answer that arrives within the window (one per live replica)."""
        nc = self.runtime.nc
        inbox = nc.new_inbox()
        answers: list[ReplicaStatus] = []

        async def on_reply(msg) -> None:
            try:
                answers.append(ReplicaStatus.decode(msg.data))
            except ContractError as exc:
                log.warning("status: unreadable reply: %s", exc.reason)

        sub = await nc.subscribe(inbox, cb=on_reply)
        try:
            await nc.publish(self.runtime.subjects.rpc_status, StatusRequest().encode(), reply=inbox)
            await asyncio.sleep(self.wait_seconds)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return answers

    async def bus(self) -> BusView:
        nc = self.runtime.nc
        info = getattr(nc, "_server_info", None) or {}
        try:
            streams = await asyncio.gather(*(self._stream(spec.name) for spec in self.runtime.subjects.streams()))
        except Exception as exc:  # noqa: BLE001 - JetStream unavailable (no quorum, say): shown, not raised
            return BusView(info.get("server_name"), info.get("cluster"), error=f"{type(exc).__name__}: {exc}")
        return BusView(info.get("server_name"), info.get("cluster"), tuple(s for s in streams if s is not None))

    async def _stream(self, name: str) -> StreamView | None:
        try:
            info = await asyncio.wait_for(self.runtime.js.stream_info(name), PROBE_TIMEOUT_SECONDS)
        except NotFoundError:  # not declared (yet): not the bus being down
            return None
        cluster = info.cluster
        peers = tuple(Peer(p.name or "?", bool(p.current), bool(p.offline), int(p.lag or 0))
                      for p in (cluster.replicas or [])) if cluster else ()
        return StreamView(name, int(info.config.num_replicas or 1), int(info.state.messages or 0),
                          cluster.leader if cluster else None, peers)

    async def database(self) -> DatabaseView:
        started = time.perf_counter()
        try:
            await asyncio.wait_for(self.runtime.pool.fetchval("SELECT 1"), PROBE_TIMEOUT_SECONDS)
        except Exception as exc:  # noqa: BLE001 - any failure is "unreachable", with its name
            return DatabaseView(False, error=f"{type(exc).__name__}: {exc}"[:500])
        return DatabaseView(True, round((time.perf_counter() - started) * 1000, 2))
