"""No replacement storm, end to end: real health service, real gateway, real executor agents whose matmul is
made to fail by the test switch on the whole group (a bad driver rollout, as far as Teto can tell).

With a replacement budget of 1: one node is replaced, the next replacement due raises the group's
systemic-failure alert instead (no second provisioner call), the failing node stays failed and held, and the
alert shows in the nodes API. Clearing it (``fleet:manage`` only) resumes the usual path: the held node is
checked again and, failing again, is replaced with the fresh budget. The clear is audited like every command.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

import pytest

from agents.executor.main import serve as agent_serve
from agents.executor.checks.handler import Reboot
from agents.executor.settings import ExecutorSettings
from libs.contracts.nodes import NodeEvent
from services.audit.app import serve as audit_serve
from services.audit.settings import AuditSettings
from services.health.app import serve as health_serve
from services.health.settings import HealthSettings

from tests.integration.helpers_hba import collect
from tests.integration.test_gateway import gateway
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration
GROUP = "g"


@contextlib.asynccontextmanager
async def agents(env, names: list[str], fault: str):
    tasks = []
    for name in names:
        settings = env.settings(ExecutorSettings, executor_id=f"ex-{name}", node_id=f"node-{name}", group=GROUP,
                                check_timeout_seconds=120, torch_threads=1, advertise_host="127.0.0.1",
                                test_fault=fault)

        async def loop(settings=settings) -> None:
            while True:
                with contextlib.suppress(Reboot):  # max_reboots 0 here: never asked, but a reboot restarts in place
                    await agent_serve(settings)
                    return

        tasks.append(asyncio.create_task(loop(), name=name))
    try:
        yield
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


def events_of(col, node: str) -> list[str]:
    return [NodeEvent.decode(m.data).event.value for m in col.msgs
            if b'"teto.node.event/1"' in m.data and NodeEvent.decode(m.data).node_id == node]


async def test_a_group_failing_the_same_test_stops_at_the_budget_raises_an_alert_and_resumes_when_cleared(
        env, tmp_path):
    provisioned = tmp_path / "provisioned"
    provisioned.mkdir()
    hook = (f"{sys.executable} -c \"import pathlib,sys; pathlib.Path(sys.argv[1]).write_text(sys.argv[2])\" "
            f"{provisioned}/{{node_id}} {{group}}")
    hs = env.settings(HealthSettings, join_batch_seconds=1.0, check_interval_seconds=0.3, max_reboots=0,
                      replacement_budget=1, replacement_window_seconds=3600, provisioner_command=hook,
                      min_ratio=0.05, evaluate_interval_seconds=0.5)
    async with running(health_serve, hs), running(audit_serve, env.settings(AuditSettings)), \
            gateway(env, stand_in=False, timeout=10.0) as gw, \
            collect(hs.nats_url, hs.subjects.node_all) as col, agents(env, ["a", "b"], "matmul:fail"):
        async def states() -> dict[str, str]:
            rows = await gw.rt.pool.fetch("SELECT node_id, state FROM health.nodes WHERE group_name = $1", GROUP)
            return {r["node_id"]: r["state"] for r in rows}

        async def settled() -> bool:
            return sorted((await states()).values()) == ["failed", "replaced"]

        await eventually(settled, timeout=180, every=0.2)
        now = await states()
        replaced = next(n for n, s in now.items() if s == "replaced")
        held = next(n for n, s in now.items() if s == "failed")

        # 1. Replacing stopped at the budget: one provisioner call, the other node kept failed and held.
        await eventually(lambda: asyncio.sleep(0, (provisioned / replaced).exists()), timeout=20)
        assert sorted(p.name for p in provisioned.iterdir()) == [replaced]
        assert events_of(col, replaced) == ["joining", "checking", "failed", "replaced"]
        assert events_of(col, held) == ["joining", "checking", "failed"]

        # 2. The alert, in the API: the group's and every node's, the held node's reason naming it.
        groups = (await gw.client.get("/v1/node-groups", headers=gw.as_("viewer"))).json()
        alert = next(g for g in groups if g["group_name"] == GROUP)["alert"]
        assert "replacement budget spent (1 of 1" in alert["reason"] and alert["tests"] == ["matmul"]
        assert alert["nodes"] == [replaced, held]
        nodes = {n["node_id"]: n for n in (await gw.client.get("/v1/nodes", headers=gw.as_("viewer"))).json()}
        assert nodes[held]["held"] and not nodes[held]["schedulable"] and "systemic failure" in nodes[held]["reason"]
        assert nodes[replaced]["alert"] == alert

        # 3. Clearing needs fleet:manage; an operator clears it and the held node is checked again.
        assert (await gw.client.post(f"/v1/node-groups/{GROUP}/clear-alert", json={},
                                     headers=gw.as_("viewer"))).status_code == 403
        resp = await gw.client.post(f"/v1/node-groups/{GROUP}/clear-alert", json={"reason": "looked at it"},
                                    headers=gw.as_("operator"))
        assert resp.status_code == 200, resp.text
        assert resp.json()["released"] == [held] and resp.json()["cleared"]["reason"] == alert["reason"]
        again = await gw.client.post(f"/v1/node-groups/{GROUP}/clear-alert", json={}, headers=gw.as_("operator"))
        assert again.status_code == 409 and "no systemic-failure alert" in again.json()["reason"]

        # 4. Replacing resumed with a fresh budget: still failing matmul, the node is replaced this time.
        await eventually(lambda: asyncio.sleep(0, (provisioned / held).exists()), timeout=120, every=0.2)
        assert events_of(col, held) == ["joining", "checking", "failed", "joining", "checking", "failed",
                                        "replaced"]
        groups = (await gw.client.get("/v1/node-groups", headers=gw.as_("viewer"))).json()
        assert next(g for g in groups if g["group_name"] == GROUP)["alert"] is None

        # 5. Audited like every command: the viewer's refusal, the operator's clear and its second, refused try.
        async def audited() -> list:
            rows = await gw.rt.pool.fetch("SELECT actor, outcome, reason FROM audit.log_public"
                                          " WHERE kind = 'clear_group_alert' ORDER BY seq")
            outcomes = [(r["actor"], r["outcome"]) for r in rows]
            return rows if outcomes.count(("operator-actor", "refused")) and ("operator-actor", "accepted") in \
                outcomes and ("viewer-actor", "refused") in outcomes else []

        await eventually(audited, timeout=20)
