"""A node registration may only name its sender (the health service's side of issue 26, item 4).

The bus lets only a node's own executor publish its registration, but not what the body names. With the real
health service (real NATS and PostgreSQL): ex-a registers node-a and heartbeats; a second registration of node-a
naming a made-up executor is refused, visibly on ``teto.rejected.health``, and node-a stays bound to ex-a: when a
silent node registered after it is marked gone, node-a is not (before the fix it was re-bound and marked gone).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg

from libs.contracts.envelope import RejectedMessage
from libs.contracts.nodes import NodeEvent
from libs.contracts.telemetry import Heartbeat, Phase
from libs.runtime.bus import publish
from services.health.app import serve
from services.health.settings import HealthSettings
from tests.integration.helpers_hba import collect, jetstream
from tests.integration.test_check_deadlines import registration
from tests.support.services import eventually, running


async def test_a_registration_re_binding_a_live_node_to_a_made_up_executor_is_refused(env):
    settings = env.settings(HealthSettings, join_batch_seconds=0, check_interval_seconds=0.2,
                            node_gone_seconds=2.0, evaluate_interval_seconds=0.5)
    s = settings.subjects
    pg = await asyncpg.connect(env.database_url)
    try:
        async with running(serve, settings), jetstream(settings.nats_url) as (nc, js), \
                collect(settings.nats_url, s.rejected("health")) as rejected, \
                collect(settings.nats_url, s.node_all) as nodes:

            async def beat() -> None:
                await publish(js, s.heartbeat("ex-a"), Heartbeat(
                    executor_id="ex-a", node_id="node-a", group="g1", phase=Phase.IDLE, sent_at=datetime.now(UTC),
                    interval_seconds=0.5, progress_interval_seconds=1))

            await publish(js, s.node("node-a", "registered"), registration("a"))
            await eventually(lambda: pg.fetchval("SELECT executor_id = 'ex-a' FROM health.nodes"
                                                 " WHERE node_id = 'node-a'"), 15)
            await beat()
            await eventually(lambda: pg.fetchval("SELECT last_heartbeat IS NOT NULL FROM health.executors"
                                                 " WHERE executor_id = 'ex-a'"), 15)

            forged = registration("a").model_copy(update={"executor_id": "made-up", "boot_id": "boot-x"})
            await publish(js, s.node("node-a", "registered"), forged)
            (msg,) = await eventually(lambda: asyncio.sleep(0, rejected.msgs[:1]), 15)
            note = RejectedMessage.decode(msg.data)
            assert note.subject == s.node("node-a", "registered")
            assert "names executor 'made-up'" in note.reason and "bound to executor 'ex-a'" in note.reason
            assert await pg.fetchval("SELECT executor_id FROM health.nodes WHERE node_id = 'node-a'") == "ex-a"
            assert await pg.fetchval("SELECT count(*) FROM health.executors WHERE executor_id = 'made-up'") == 0

            # node-b registers after the forged registration and never beats: once the service marks it gone,
            # it has judged node-a too (re-bound to made-up, node-a would have gone first). ex-a beats meanwhile.
            await publish(js, s.node("node-b", "registered"), registration("b"))

            async def node_b_gone() -> bool:
                await beat()
                return await pg.fetchval("SELECT state = 'gone' FROM health.nodes WHERE node_id = 'node-b'")

            assert await eventually(node_b_gone, 30)
            assert await pg.fetchval("SELECT state FROM health.nodes WHERE node_id = 'node-a'") != "gone"
            assert await pg.fetchval("SELECT executor_id FROM health.nodes WHERE node_id = 'node-a'") == "ex-a"


            def gone_events() -> list[str]:
                return [e.node_id for e in (NodeEvent.decode(m.data) for m in nodes.msgs
                                            if b'"teto.node.event/1"' in m.data) if e.state == "gone"]

            assert await eventually(lambda: asyncio.sleep(0, gone_events()), 15) == ["node-b"]  # its event came
    finally:
        await pg.close()
