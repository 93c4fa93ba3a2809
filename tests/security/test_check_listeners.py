"""Attack (issue 26, item 6): the executors' check listeners were reachable on every address of the host (the
reachability echo server and a check collective's rank-0 rendezvous bound 0.0.0.0 / [::]). They listen on the
node's advertised address only: dialled on another address of the same host, nothing answers. Two local
addresses stand for two networks: 127.0.0.1 (advertised) and 127.0.0.2 (any other)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.executor.checks import reach
from agents.executor.settings import ExecutorSettings
from libs.runtime.ports import free_port
from tests.integration.helpers_executor import agent_with_fake_queue
from tests.support.services import eventually

pytestmark = pytest.mark.security

ADVERTISED, OTHER = "127.0.0.1", "127.0.0.2"


def listening(pid: int) -> set[tuple[str, int]]:
    """The (address, port) of each TCP socket process ``pid`` listens on, read from /proc (IPv4 dotted, IPv6 as
    the kernel's hex; ``0.0.0.0`` and the all-zero IPv6 address are "every address")."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                if len(address) == 8:
                    address = ".".join(str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0))
                found.add((address, int(port, 16)))
    return found


async def test_the_reachability_listener_answers_on_the_advertised_address_only():
    server, port = await reach.start_listener(ADVERTISED)
    try:
        reader, writer = await asyncio.open_connection(ADVERTISED, port)
        writer.write(b"teto-ping\n")
        assert await reader.readline() == b"teto-ping\n"
        writer.close()
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(OTHER, port)
        assert listening(os.getpid()) >= {(ADVERTISED, port)}
    finally:
        server.close()
        await server.wait_closed()


async def test_an_agent_listens_on_its_advertised_address_only(env):
    before = listening(os.getpid())
    settings = env.settings(ExecutorSettings, executor_id="listen-1", advertise_host=ADVERTISED)
    async with agent_with_fake_queue(settings):
        opened = listening(os.getpid()) - before
        assert opened and {address for address, _ in opened} == {ADVERTISED}, opened
        for _, port in opened:
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection(OTHER, port)


async def test_behind_nat_the_listeners_bind_the_configured_local_address(env):
    before = listening(os.getpid())
    settings = env.settings(ExecutorSettings, executor_id="listen-2", advertise_host="192.0.2.1",  # not on this host
                            check_bind_host=ADVERTISED)
    async with agent_with_fake_queue(settings):
        opened = listening(os.getpid()) - before
        assert opened and {address for address, _ in opened} == {ADVERTISED}, opened


def test_an_advertised_address_that_is_not_this_hosts_is_refused_by_name():
    with pytest.raises(OSError, match="TETO_ADVERTISE_HOST"):
        asyncio.run(reach.start_listener("192.0.2.1"))  # TEST-NET-1: on no interface of this host


def rank(spec: dict) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "agents.executor.checks"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(spec))
    proc.stdin.close()
    return proc


async def test_a_check_collective_listens_on_the_advertised_address_only():
    port = free_port(ADVERTISED)
    spec = {"tests": ["allreduce"], "world_size": 2, "rendezvous": f"{ADVERTISED}:{port}",
            "collective_timeout_seconds": 60, "bind_host": ADVERTISED}
    rank0 = rank({**spec, "rank": 0})
    rank1 = None
    seen: set[tuple[str, int]] = set()
    try:
        def rank0_waits() -> bool:  # its rendezvous store listens, before rank 1 comes
            seen.update(listening(rank0.pid))
            return any(p == port for _, p in seen)
        await eventually(rank0_waits, 60, "rank 0's rendezvous listener")
        with pytest.raises(ConnectionRefusedError):
            await asyncio.open_connection(OTHER, port)
        rank1 = rank({**spec, "rank": 1})

        def both_done() -> bool:
            for proc in (rank0, rank1):
                if proc.poll() is None:
                    seen.update(listening(proc.pid))
            return rank0.poll() is not None and rank1.poll() is not None
        await eventually(both_done, 90, "both ranks to finish the all-reduce")
        results = [json.loads(p.stdout.read().splitlines()[-1]) for p in (rank0, rank1)]
        assert [r["status"] for r in results] == ["passed", "passed"], results
        assert {address for address, _ in seen} == {ADVERTISED}, seen
    finally:
        for proc in (rank0, rank1):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
