"""A TCP proxy a test can sever and restore: the network partition of the fault tests.

It forwards every connection to a real server (NATS here) and runs in its own thread with its own event loop,
so a test that blocks its own loop (or runs none) cannot stall the traffic it forwards. ``cut()`` aborts every
open connection and refuses new ones until ``restore()``: to a client it looks like a severed link, not a
clean shutdown, and nothing it sends gets through.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any

CHUNK = 1 << 16


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.severed = False
        self.accepted = 0  # connections forwarded (a reconnect after restore() counts again)
        self.refused = 0  # connections refused while severed
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._links: set[asyncio.Transport] = set()

    @classmethod
    def to_url(cls, url: str) -> TcpProxy:
        """A proxy in front of ``nats://host:port``."""
        host, port = url.split("://", 1)[-1].rsplit(":", 1)
        return cls(host, int(port))

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def start(self) -> TcpProxy:
        self._thread.start()
        self._server = self._call(self._listen())
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.severed:
            self.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self.accepted += 1
        links = {writer.transport, up_writer.transport}
        self._links |= links
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self._links -= links
            for t in links:
                t.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while data := await reader.read(CHUNK):
                if self.severed:
                    return
                writer.write(data)
                await writer.drain()
        writer.transport.abort()

    async def _cut(self) -> int:
        self.severed = True
        n = len(self._links)
        for t in list(self._links):
            t.abort()  # RST, not FIN: the peer learns nothing more than that the link is gone
        return n

    def cut(self) -> int:
        """Sever every connection and refuse new ones; returns how many links were cut."""
        return self._call(self._cut())

    def restore(self) -> None:
        """Accept and forward connections again (clients reconnect on their own)."""
        self._loop.call_soon_threadsafe(setattr, self, "severed", False)

    async def _close(self) -> None:
        await self._cut()
        if self._server is not None:
            self._server.close()

    def close(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                self._call(self._close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
