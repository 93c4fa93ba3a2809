"""Free TCP ports for the servers Teto starts (NATS, PostgreSQL, the gateways, /metrics, a check collective's
rank 0), chosen BELOW the kernel's ephemeral range.

A port the kernel chose (a bind to port 0) is an ephemeral one, which any process's next outgoing connection (to
NATS, to PostgreSQL, over HTTP) may be handed in the moments, or hours, before the server it was chosen for binds
it, or while that server is down and restarted on it. Outgoing connections are never given a port below the
range, so a port chosen there stays free unless a server binds it on purpose (``port_is_free`` checks that at
the choice). Torch's own rendezvous default, 29500, lies there for the same reason.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (loopback by default; ``0.0.0.0``: on every address), below the kernel's
    ephemeral range (``free_port_block``)."""
    return free_port_block(1, host=host)


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``port`` can be listened on now (a listener elsewhere, or a port being closed, says no)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT does not count
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port_block(count: int, tries: int = 200, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive free ports, chosen BELOW the kernel's ephemeral range.

    A port the kernel chose says nothing about its neighbours, and any process may be handed it once it is
    released. A block of consecutive ports (the gateway replicas listen on ``--http-port`` and the ports after it)
    taken from outside that range is never handed out by the kernel."""
    low, _high = _ephemeral_range()
    floor = 10000 if low > 12000 else 1024
    rng = random.Random()
    for _ in range(tries):
        first = rng.randrange(floor, low - count)
        if all(port_is_free(first + i, host) for i in range(count)):
            return first
    raise RuntimeError(f"no {count} consecutive free ports below {low}")
