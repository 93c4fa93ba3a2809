"""The reachability listener: a tiny TCP echo server every agent keeps open, so the connectivity test of
another node of the group can dial it without disturbing anything that runs here. Also picks the port this
node offers as rank 0 of a check collective (chosen free at start, released until a collective needs it).

Both listen on the node's advertised address only (``advertise_host``, the one its peers are told), never on
0.0.0.0: a check listener is for the group's nodes, not for every network the host is on."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

from libs.runtime import ports


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(Exception):
        line = await asyncio.wait_for(reader.readline(), 5)
        writer.write(line)
        await writer.drain()
    writer.close()


async def start_listener(host: str) -> tuple[asyncio.base_events.Server, int]:
    """The echo server on ``host`` (the advertised address) and the port the kernel gave it."""
    try:
        server = await asyncio.start_server(_echo, host, 0)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot listen on the advertised address {host!r} (TETO_ADVERTISE_HOST must be "
                                 f"an address of this host, or set TETO_CHECK_BIND_HOST to one): {exc.strerror}"
                      ) from exc
    return server, server.sockets[0].getsockname()[1]


def rendezvous_listener(host: str, port: int) -> socket.socket:
    """Rank 0's rendezvous socket of a check collective, bound to ``host`` only and listening: handed to torch's
    TCPStore (``master_listen_fd``), which would otherwise listen on every address."""
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(128)
    except OSError:
        listener.close()
        raise
    return listener


def free_port() -> int:
    """Free on every address, and below the ephemeral range: chosen at start and bound only when a collective
    needs it, possibly hours later, it must not be a port the kernel may hand to an outgoing connection meanwhile
    (a rank 0 that cannot bind fails the connectivity test, and a failed node is rebooted or replaced)."""
    return ports.free_port("0.0.0.0")


def bind_host(settings: Any) -> str:
    """The address the check listeners bind: ``check_bind_host``, else the advertised host."""
    return settings.check_bind_host or advertised_host(settings.advertise_host)


def advertised_host(configured: str | None) -> str:
    """The host other nodes use to reach this one: configured, else this host's address, else loopback."""
    if configured:
        return configured
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
