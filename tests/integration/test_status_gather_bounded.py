"""``GET /v1/status``'s gatherer (services/gateway/status.py) against a real NATS server, with parts that are
down or hang: a member URL nobody listens on, a database and an executors read that never answer, no service
replica running, the gateway's own connection closed. Every part is asked with its own timeout, so the answer
comes back (instead of hanging or failing whole) and names each part that did not answer."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from libs.contracts.status import ReplicaStatus
from libs.runtime import bus
from libs.runtime.natsauth import SERVICES
from libs.runtime.ports import free_port
from services.gateway.settings import GatewaySettings
from services.gateway.status import StatusGatherer, member_address, server_info

pytestmark = pytest.mark.timeout(120)
NEVER = 3600  # a part that hangs: only its own timeout ends it


class Hanging:
    """A database pool and a reads object whose every call hangs (a partitioned database, say)."""

    async def fetchval(self, *_: Any) -> Any:
        await asyncio.sleep(NEVER)

    async def executors(self) -> list[dict[str, Any]]:
        await asyncio.sleep(NEVER)
        return []


class Answering:
    async def fetchval(self, *_: Any) -> int:
        return 1

    async def executors(self) -> list[dict[str, Any]]:
        return [{"signal": "ok", "job_id": None, "accepting": True}]


async def runtime_on(env, nats_url: str, pool: Any) -> SimpleNamespace:
    settings = env.settings(GatewaySettings, nats_url=nats_url)
    nc = await bus.connect(env.infra.nats_url, "teto-test-status")
    js = nc.jetstream(timeout=10)
    await bus.ensure_streams(js, settings.subjects)
    return SimpleNamespace(settings=settings, subjects=settings.subjects, nc=nc, js=js, pool=pool)


def test_member_address_drops_credentials_and_defaults_the_port():
    assert member_address("nats://u:p@10.0.0.5:4333") == ("10.0.0.5", 4333, "nats://10.0.0.5:4333")
    assert member_address("tls://nats-1") == ("nats-1", 4222, "tls://nats-1:4222")
    assert member_address("127.0.0.1:5000") == ("127.0.0.1", 5000, "nats://127.0.0.1:5000")


async def test_a_member_answers_its_probe_with_its_server_info(env):
    host, port, _ = member_address(env.infra.nats_url)
    info = await server_info(host, port)
    assert info["server_id"] and info["port"] == port


async def test_hanging_parts_and_a_dead_member_are_named_and_the_rest_is_shown(env):
    dead = f"nats://127.0.0.1:{free_port()}"
    rt = await runtime_on(env, f"{env.infra.nats_url},{dead}", Hanging())
    gatherer = StatusGatherer(rt, Hanging(), wait_seconds=0.5, part_timeout=1.0)
    try:
        st = (await asyncio.wait_for(gatherer.status(), 60)).as_dict()
    finally:
        await rt.nc.close()
    problems = st["problems"]
    assert st["ok"] is False
    assert any(p.startswith(f"nats member at {dead} did not answer: ") for p in problems), problems
    assert "database unreachable: no answer in time" in problems
    assert "executors: unreadable: no answer in time" in problems
    assert [f"{s}: no replica answered" for s in sorted(SERVICES)] == [p for p in problems if "replica answered" in p]
    # What did answer is shown: the live member and every declared stream with its leader.
    streams = {s["name"]: s for s in st["nats"]["streams"]}
    assert set(streams) == {spec.name for spec in rt.subjects.streams()}
    assert all(s["leader"] for s in streams.values()), streams
    assert st["nats"]["members"] and all(m["online"] for m in st["nats"]["members"])


async def test_a_replica_that_stops_answering_is_named_missing(env):
    rt = await runtime_on(env, env.infra.nats_url, Answering())
    replies = {"queue-1": ReplicaStatus(service="queue", instance="queue-1", started_at="2026-12-01T12:00:00Z"),
               "queue-2": ReplicaStatus(service="queue", instance="queue-2", started_at="2026-12-01T12:00:00Z")}
    alive = set(replies)

    async def answer(msg) -> None:
        for name in sorted(alive):
            await rt.nc.publish(msg.reply, replies[name].encode())

    sub = await rt.nc.subscribe(rt.subjects.rpc_status, cb=answer)
    gatherer = StatusGatherer(rt, Answering(), wait_seconds=0.5, part_timeout=5.0)
    try:
        first = (await gatherer.status()).as_dict()
        alive.discard("queue-2")
        second = (await gatherer.status()).as_dict()
    finally:
        await sub.unsubscribe()
        await rt.nc.close()
    assert [r["instance"] for r in first["services"]["queue"]["replicas"]] == ["queue-1", "queue-2"]
    assert not any("did not answer" in p for p in first["problems"]), first["problems"]
    assert [p for p in second["problems"] if p.startswith("queue: replica queue-2 did not answer")], second
    assert [r["instance"] for r in second["services"]["queue"]["replicas"]] == ["queue-1"]


async def test_the_gateway_off_the_bus_says_so_and_still_answers(env):
    rt = await runtime_on(env, env.infra.nats_url, Answering())
    await rt.nc.close()  # what a reconnecting connection looks like to the gatherer: not connected
    st = (await asyncio.wait_for(StatusGatherer(rt, Answering(), 0.5, 1.0).status(), 60)).as_dict()
    assert st["ok"] is False and st["services"] == {}
    assert st["problems"] == ["NATS: the gateway is not connected to NATS (reconnecting)"]
    assert st["database"]["reachable"] is True and st["executors"]["total"] == 1
    assert st["nats"]["members"][0]["online"] is True  # its probe answered: the member is up, our link is not

