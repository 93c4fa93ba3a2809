"""A node whose agent is gone neither sets the bar nor is a peer, and leaves scheduling (issue 26, item 1).

Real NATS and PostgreSQL, the real health and queue services and real executor agents (their check suites run
as child processes). Two nodes pass; one's agent then stops without a word (as every agent did when ``teto up``
was restarted, or as a machine powered off without deregistering). Its figures are made absurdly high, so a
median that still counted it would fail any node. A third node joins: it is not given the dead node as a peer
(its connectivity test would be refused), its figures are judged against the live node only, and it passes.
The dead node is marked gone and leaves scheduling; its agent back under the same identity brings it back.
"""

from __future__ import annotations

import json

import pytest

from services.health.app import serve as health_serve
from services.health.settings import HealthSettings
from services.queue.settings import QueueSettings

from tests.integration.helpers_hba import collect
from tests.integration.helpers_queue import client, queue_service
from tests.integration.test_node_checks import Agents, node_events
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration


async def test_a_dead_node_is_no_peer_no_median_sample_and_leaves_scheduling(env):
    hs = env.settings(HealthSettings, join_batch_seconds=0.5, check_interval_seconds=0.3, min_ratio=0.05,
                      evaluate_interval_seconds=0.5, node_gone_seconds=4.0)
    qs = env.settings(QueueSettings, schedule_interval_seconds=0.2)
    agents = Agents(env)

    async with running(health_serve, hs), queue_service(qs), client(qs) as c, \
            collect(hs.nats_url, hs.subjects.node_all) as col:
        async def state_of(name: str) -> str | None:
            return await c.db.fetchval("SELECT state FROM health.nodes WHERE node_id = $1", f"node-{name}")

        async def is_(name: str, state: str) -> bool:
            return await state_of(name) == state

        try:
            agents.start("live")
            agents.start("dead")
            await eventually(lambda: is_("live", "ready"), timeout=90)
            await eventually(lambda: is_("dead", "ready"), timeout=30)

            # The dead node's agent stops without a word; its figures would fail anyone judged against them.
            await agents.stop_one("dead")
            figures = json.loads(await c.db.fetchval("SELECT figures FROM health.nodes WHERE node_id = 'node-dead'"))
            inflated = {test: {k: (v * 1e6 if k.startswith("tflops_") or k.endswith("_gbps") else v)
                               for k, v in f.items()} for test, f in figures.items()}
            await c.db.execute("UPDATE health.nodes SET figures = $1::jsonb WHERE node_id = 'node-dead'",
                               json.dumps(inflated))
            silent_past = hs.effective_signal_timeout + 0.5
            await eventually(lambda: c.db.fetchval(
                "SELECT last_heartbeat < now() - make_interval(secs => $1) FROM health.executors"
                " WHERE executor_id = 'ex-dead'", silent_past), timeout=30)

            agents.start("new")
            await eventually(lambda: is_("new", "ready"), timeout=90)
            results = {r["test"]: r for r in await c.db.fetch(
                "SELECT test, status, verdict, figures FROM health.check_results WHERE node_id = 'node-new'")}
            assert {t: r["status"] for t, r in results.items()}["connectivity"] == "passed"
            sources = {cmp["source"] for r in results.values()
                       for cmp in json.loads(r["verdict"]).get("comparisons", [])}
            assert sources == {"group median of 1"}, sources  # the live node alone, never the dead one

            # The dead node leaves scheduling (gone), in health and in the queue's copy of node states.
            await eventually(lambda: is_("dead", "gone"), timeout=30)
            gone = next(e for e in node_events(col) if e.node_id == "node-dead" and e.event == "gone")
            assert not gone.schedulable and "no heartbeat" in (gone.reason or "")
            await eventually(lambda: c.db.fetchval(
                "SELECT NOT schedulable FROM queue.nodes WHERE node_id = 'node-dead'"), timeout=20)

            # Its agent back under the same identity: joining, checked, ready again; nothing rebooted or replaced.
            agents.start("dead")
            await eventually(lambda: is_("dead", "ready"), timeout=90)
            kinds = [e.event.value for e in node_events(col) if e.node_id == "node-dead"]
            assert "recovering" not in kinds and "replaced" not in kinds, kinds
        finally:
            await agents.stop()
