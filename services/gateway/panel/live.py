"""The live feed: ONE Server-Sent-Events connection per browser tab (``GET /live``), fed from JetStream.

The gateway process follows the watched streams once (feed.WATCHED, through libs/runtime/tail.follow: ordered,
ephemeral, read-only consumers from now on) and fans each message out to the connected tabs, each scoped to
what its principal may read (feed.scoped). The owner of a job is looked up once through the public view and
remembered. A tab that cannot keep up loses its oldest events and is told to reload (``event: reload``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from libs.runtime import tail

from ..auth import Permission, Principal, require
from ..errors import unavailable
from ..scoping import sees_all
from . import feed

log = logging.getLogger(__name__)
QUEUE_SIZE = 1000
KEEPALIVE_SECONDS = 15.0
OWNER_CACHE = 10_000


class Tab:
    def __init__(self, principal: Principal, only_job: str | None) -> None:
        self.principal = principal
        self.only_job = only_job
        self.sees_all = sees_all(principal)
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUE_SIZE)
        self.overflowed = False

    def offer(self, event: dict[str, Any]) -> None:
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            self.overflowed = True


class Hub:
    def __init__(self, runtime: Any, reads: Callable[[], Any]) -> None:
        self.runtime = runtime
        self.reads = reads
        self.tabs: set[Tab] = set()
        self.owners: OrderedDict[str, str | None] = OrderedDict()
        self._subs: list[Any] = []
        self._started = False
        self._lock = asyncio.Lock()

    @property
    def available(self) -> bool:
        return self.runtime is not None

    async def start(self) -> None:
        async with self._lock:
            if self._started:
                return
            subjects = self.runtime.subjects
            try:
                for base, attribute in feed.WATCHED:
                    stream = subjects.stream_name(base)

                    async def on_message(subject: str, body: dict[str, Any], base: str = base) -> None:
                        await self.publish(feed.to_event(base, subject, body))

                    self._subs.append(await tail.follow(self.runtime.js, stream, getattr(subjects, attribute),
                                                        on_message))
            except Exception:
                await self.close()  # all or nothing: the next tab tries again from scratch
                raise
            self._started = True

    async def owner_of(self, job_id: str) -> str | None:
        if job_id in self.owners:
            self.owners.move_to_end(job_id)
            return self.owners[job_id]
        reads = self.reads()
        found = (await reads.job_owners([job_id])).get(job_id) if reads is not None else None
        if found is not None:  # an unknown job may be one just submitted: ask again next time
            self.owners[job_id] = found
            while len(self.owners) > OWNER_CACHE:
                self.owners.popitem(last=False)
        return found

    async def publish(self, event: dict[str, Any] | None) -> None:
        if event is None or not self.tabs:
            return
        job_id = event.get("job_id")
        owner = None
        if job_id is not None and any(not tab.sees_all for tab in self.tabs):
            owner = await self.owner_of(job_id)
        for tab in list(self.tabs):
            shown = feed.scoped(event, tab.principal, owner, sees_all=tab.sees_all, only_job=tab.only_job)
            if shown is not None:
                tab.offer(shown)

    async def stream(self, tab: Tab) -> AsyncIterator[bytes]:
        self.tabs.add(tab)
        try:
            yield b"retry: 2000\n\n"
            yield b"event: hello\ndata: {}\n\n"
            while True:
                if tab.overflowed:
                    yield b"event: reload\ndata: {}\n\n"
                    return
                try:
                    event = await asyncio.wait_for(tab.queue.get(), KEEPALIVE_SECONDS)
                except asyncio.TimeoutError:
                    yield b": keep-alive\n\n"
                    continue
                data = json.dumps(event, separators=(",", ":"), default=str)
                yield f"event: {event['type']}\ndata: {data}\n\n".encode()
        finally:
            self.tabs.discard(tab)

    async def close(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()


def register(router: APIRouter) -> None:

    @router.get("/live")
    async def live(request: Request, job: str | None = None,
                   principal: Principal = Depends(require(Permission.READ))) -> StreamingResponse:
        hub: Hub = request.app.state.live
        if not hub.available:
            raise unavailable()
        await hub.start()
        return StreamingResponse(hub.stream(Tab(principal, job)), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
