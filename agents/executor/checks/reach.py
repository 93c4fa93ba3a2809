"""The reachability listener: a tiny TCP echo server every agent keeps open, so the connectivity test of
another node of the group can dial it without disturbing anything that runs here. Also picks the port this
node offers as rank 0 of a check collective (chosen free at start, released until a collective needs it)."""

from __future__ import annotations

import asyncio
import contextlib
import socket

from libs.runtime import ports


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        line = await asyncio.wait_for(reader.readline(), 5)
        writer.write(line)
        await writer.drain()
    writer.close()


async def start_listener(bind: str = "0.0.0.0") -> tuple[asyncio.base_events.Server, int]:
    server = await asyncio.start_server(_echo, bind, 0)
    return server, server.sockets[0].getsockname()[1]


def free_port() -> int:
    """Free on every address, and below the ephemeral range: chosen at start and bound only when a collective
    needs it, possibly hours later, it must not be a port the kernel may hand to an outgoing connection meanwhile
    (a rank 0 that cannot bind fails the connectivity test, and a failed node is rebooted or replaced)."""
    return ports.free_port("0.0.0.0")


def advertised_host(configured: str | None) -> str:
    """The host other nodes use to reach this one: configured, else this host's address, else loopback."""
    if configured:
        return configured
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
