"""A check report is believed only about the reporting executor's own node (the health service's side of
attack 2): the bus binds the sender's executor id, and the health service refuses, visibly on
``teto.rejected.health``, a verdict one executor gives about another executor's node."""

from __future__ import annotations

import asyncio

from libs.contracts.envelope import RejectedMessage
from libs.contracts.nodes import CheckReport, RunChecks
from libs.runtime.bus import publish
from services.health.app import serve
from tests.integration.helpers_hba import collect, jetstream
from tests.integration.test_check_deadlines import registration, settings_for
from tests.support.services import eventually, running


async def test_an_executor_cannot_fail_another_executors_node(env):
    settings = settings_for(env)
    s = settings.subjects
    async with running(serve, settings), jetstream(settings.nats_url) as (nc, js), \
            collect(settings.nats_url, s.agent("ex-a", "check")) as directives, \
            collect(settings.nats_url, s.rejected("health")) as rejected:
        for name in ("a", "b"):
            await publish(js, s.node(f"node-{name}", "registered"), registration(name))
        directive = await eventually(lambda: asyncio.sleep(0, directives.msgs[:1]), timeout=15)
        d = RunChecks.decode(directive[0].data)
        forged = CheckReport(run_id=d.run_id, node_id="node-a", executor_id="ex-b", test="matmul", attempt=1,
                             status="failed", error="forged by ex-b")
        await publish(js, s.check(d.run_id, "failed", "ex-b"), forged)
        notes = await eventually(lambda: asyncio.sleep(0, [RejectedMessage.decode(m.data) for m in rejected.msgs]),
                                 timeout=15)
        assert "which is executor ex-a's" in notes[0].reason and notes[0].subject.endswith(".ex-b")
