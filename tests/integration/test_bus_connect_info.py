"""libs/runtime/bus.connect never hands out a connection nats-py left "connecting".

nats-py 2.16 reads exactly one line after its connect PING and counts the connection made only if it is the
PONG. nats-server 2.15 follows a CONNECT with an INFO (``connect_info``) which, on a loaded machine, comes
before the PONG: plain nats-py then never sends a subscription or a request on that connection (seen on the
clustered rehearsal, docs/reliability.md). A server that always answers so proves the connection bus.connect
returns is connected and carries what is published on it.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from libs.runtime import bus

pytestmark = pytest.mark.integration

INFO = {"server_id": "FAKE", "version": "2.15.1", "proto": 1, "headers": True, "max_payload": 1048576,
        "host": "127.0.0.1", "port": 0}


class InfoBeforePong:
    """A minimal NATS server that sends its post-CONNECT INFO before the PONG of the connect PING."""

    def __init__(self) -> None:
        self.connections = 0
        self.published: list[str] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        first = True
        info = f"INFO {json.dumps(INFO)}\r\n".encode()
        late_info = f"INFO {json.dumps({**INFO, 'connect_info': True})}\r\n".encode()
        writer.write(info)
        await writer.drain()
        try:
            while line := await reader.readline():
                if line.startswith(b"PING"):
                    writer.write(late_info + b"PONG\r\n" if first else b"PONG\r\n" + late_info)
                    first = False
                elif line.startswith(b"PUB "):
                    self.published.append(line.split()[1].decode())
                    await reader.readline()  # the payload
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


async def test_a_connection_whose_pong_follows_an_info_is_connected_and_used():
    fake = InfoBeforePong()
    server = await asyncio.start_server(fake.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        nc = await bus.connect(f"nats://127.0.0.1:{port}", "probe", attempts=3)
        try:
            assert nc.is_connected
            assert fake.connections == 1
            await nc.publish("teto.probe", b"x")
            await nc.flush(timeout=5)
            assert fake.published == ["teto.probe"]
        finally:
            await nc.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_plain_nats_py_is_left_connecting_by_that_server():
    """The defect itself (nats-py 2.16): if this starts passing, nats-py fixed it and _Client can go."""
    import nats

    fake = InfoBeforePong()
    server = await asyncio.start_server(fake.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        nc = await nats.connect(f"nats://127.0.0.1:{port}", max_reconnect_attempts=0)
        try:
            assert not nc.is_connected
        finally:
            await nc.close()
    finally:
        server.close()
        await server.wait_closed()
