"""The panel's bus reads on a real NATS server: the live hub fanning messages out to tabs scoped to what each
principal may see (a job's step history is the API's, GET /v1/jobs/{id}/steps)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from libs.runtime import bus
from services.gateway.auth import Principal, Role
from services.gateway.panel.live import Hub, Tab
from tests.support.services import eventually


def step(job_id: str, n: int) -> bytes:
    return json.dumps({"schema": "teto.progress.step/1", "kind": "step", "job_id": job_id, "epoch": 1,
                       "executor_id": "e1", "step": n, "loss": 1.0 / n, "step_seconds": 0.1}).encode()


class Owners:
    async def job_owners(self, ids):
        return {i: "ana" if i == "mine" else "bob" for i in ids}


async def test_the_hub_sends_each_tab_what_its_principal_may_see(env):
    settings = env.settings()
    s = settings.subjects
    nc = await bus.connect(settings.nats_url, "test")
    hub = Hub(SimpleNamespace(js=nc.jetstream(), subjects=s), lambda: Owners())
    try:
        js = nc.jetstream()
        await bus.ensure_streams(js, s)
        operator = Tab(Principal("t1", "olga", Role.OPERATOR), None)
        ana = Tab(Principal("t2", "ana", Role.SUBMITTER), None)
        follower = Tab(Principal("t3", "olga", Role.OPERATOR), "mine")
        hub.tabs.update({operator, ana, follower})
        await hub.start()
        await js.publish(s.progress("theirs", "e1"), step("theirs", 1))
        await js.publish(s.progress("mine", "e1"), step("mine", 2))
        await js.publish(s.heartbeat("e1"), json.dumps({"schema": "teto.hb/1", "executor_id": "e1", "job_id": "theirs",
                                                       "step": 1, "phase": "training"}).encode())

        async def drained(tab: Tab, n: int) -> list[dict]:
            await eventually(lambda: tab.queue.qsize() >= n, 10, f"{n} events")
            return [tab.queue.get_nowait() for _ in range(tab.queue.qsize())]

        seen = await drained(operator, 3)
        assert {(e["type"], e.get("job_id")) for e in seen} == {("step", "theirs"), ("step", "mine"),
                                                                 ("executor", "theirs")}
        mine = await drained(ana, 2)
        assert [e for e in mine if e["type"] == "step"] == [{"type": "step", "kind": "step", "job_id": "mine",
                                                             "executor_id": "e1", "step": 2, "loss": 0.5,
                                                             "step_seconds": 0.1}]
        (beat,) = [e for e in mine if e["type"] == "executor"]
        assert "job_id" not in beat and "step" not in beat  # another owner's job on that executor is not named
        followed = await drained(follower, 2)
        assert {(e["type"], e.get("job_id")) for e in followed} == {("step", "mine"), ("executor", "theirs")}
    finally:
        await hub.close()
        await nc.close()
        await asyncio.sleep(0)
