"""Check runs always reach a verdict, against a real health service (NATS and PostgreSQL) and fake agents:
a node whose report never arrives (no agent behind its registration) or arrives refused (a malformed report)
fails its run at the service-side deadline and takes the usual failed -> recovering path; and one node that
cannot be checked (an executor id the bus refuses as a subject token) never stops the other nodes of any group
from being checked; and a bare registration (no heartbeat ever follows) is never schedulable and is marked gone."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime

import asyncpg
import pytest

from libs.contracts.nodes import NodeEvent, NodeRegistered, RunChecks
from libs.contracts.telemetry import Heartbeat, Phase
from libs.runtime.bus import publish
from services.health.app import serve
from services.health.settings import HealthSettings

from tests.integration.helpers_hba import collect, jetstream
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration
DEADLINE = 2.0


def registration(name: str, group: str = "g1") -> NodeRegistered:
    return NodeRegistered(node_id=f"node-{name}", executor_id=f"ex-{name}", group=group, hostname=name, cpu_count=2,
                          agent_version="t", boot_id=f"boot-{name}")


def events_of(col, node: str) -> list[NodeEvent]:
    out = [NodeEvent.decode(m.data) for m in col.msgs if b'"teto.node.event/1"' in m.data]
    return [e for e in out if e.node_id == node]


def settings_for(env) -> HealthSettings:
    return env.settings(HealthSettings, join_batch_seconds=0, check_interval_seconds=0.2,
                        check_deadline_seconds=DEADLINE, max_reboots=2, evaluate_interval_seconds=0.5)


async def test_a_node_whose_report_cannot_arrive_fails_its_run_at_the_deadline(env):
    settings = settings_for(env)
    s = settings.subjects
    pg = await asyncpg.connect(env.database_url)
    try:
        async with running(serve, settings), jetstream(settings.nats_url) as (nc, js), \
                collect(settings.nats_url, s.node_all) as nodes, \
                collect(settings.nats_url, s.agent("ex-garbled", "check")) as directives:
            # ex-silent: a bare registration, no agent behind it. ex-garbled: an agent whose every report is
            # refused (a figure serialised as null, as an infinite float once was).
            for name in ("silent", "garbled"):
                await publish(js, s.node(f"node-{name}", "registered"), registration(name))
            directive = await eventually(lambda: asyncio.sleep(0, directives.msgs[:1]), timeout=15)
            d = RunChecks.decode(directive[0].data)
            started_at = asyncio.get_running_loop().time()
            bad = {"schema": "teto.check.report/1", "id": "x1", "time": "2026-01-01T00:00:00Z", "run_id": d.run_id,
                   "node_id": d.node_id, "executor_id": d.executor_id, "test": "matmul", "attempt": 1,
                   "status": "passed", "figures": {"tflops_float32": None}}
            await js.publish(s.check(d.run_id, "passed", d.executor_id), json.dumps(bad).encode())

            for name in ("silent", "garbled"):
                await eventually(lambda: asyncio.sleep(0, [e.event.value for e in events_of(nodes, f"node-{name}")]
                                                       == ["joining", "checking", "failed", "recovering"]),
                                 timeout=20)
            assert asyncio.get_running_loop().time() - started_at >= DEADLINE * 0.9  # not before the deadline
            for name in ("silent", "garbled"):
                failed = next(e for e in events_of(nodes, f"node-{name}") if e.event == "failed")
                assert "no report within 2s" in failed.reason and not failed.schedulable
                row = await pg.fetchrow("SELECT status, reason FROM health.check_run_nodes WHERE node_id = $1",
                                        f"node-{name}")
                assert row["status"] == "failed" and "no report within 2s" in row["reason"]
                results = await pg.fetch("SELECT status, error, verdict FROM health.check_results WHERE node_id = $1",
                                         f"node-{name}")
                assert results and {r["status"] for r in results} == {"failed"}
                assert all(json.loads(r["verdict"])["overdue"] for r in results)
            run = await pg.fetchrow("SELECT state FROM health.check_runs WHERE run_id = $1", d.run_id)
            assert run["state"] == "done"
    finally:
        await pg.close()


async def test_one_node_that_cannot_be_checked_never_stops_the_others(env, caplog):
    settings = settings_for(env)
    s = settings.subjects
    pg = await asyncpg.connect(env.database_url)
    caplog.set_level(logging.ERROR, logger="services.health.checks")
    try:
        async with running(serve, settings), jetstream(settings.nats_url) as (nc, js), \
                collect(settings.nats_url, s.node_all) as nodes:
            # A node stored before ids were checked at the edge: its executor id is no subject token.
            await pg.execute(
                "INSERT INTO health.nodes (node_id, group_name, executor_id, state, needs_check, since, event_seq)"
                " VALUES ('node-bad', 'g1', 'ex.bad', 'joining', true, now() - interval '1 minute', 1)")
            for name, group in (("a", "g1"), ("b", "g2")):
                await publish(js, s.node(f"node-{name}", "registered"), registration(name, group))

            # Both good nodes, in the bad one's group and in another, are checked (and, with no agent behind
            # them, fail at the deadline: many ticks have passed by then).
            for name in ("a", "b"):
                await eventually(lambda: asyncio.sleep(0, "failed" in [e.event.value for e in
                                                                       events_of(nodes, f"node-{name}")]),
                                 timeout=20)
            bad = await pg.fetchrow("SELECT state, reason, needs_check FROM health.nodes WHERE node_id = 'node-bad'")
            assert bad["state"] == "failed" and "cannot be checked" in bad["reason"] and "ex.bad" in bad["reason"]
            assert not bad["needs_check"]
            # No node event can name an executor id that is no id (the contracts refuse it): the state says it.
            assert events_of(nodes, "node-bad") == []
            flagged = [r for r in caplog.records if "node-bad" in r.getMessage()]
            assert len(flagged) == 1, [r.getMessage() for r in flagged]  # logged once, not on every tick
    finally:
        await pg.close()


async def test_a_bare_registration_is_never_schedulable_and_is_marked_gone(env):
    """A registration on the bus that no heartbeat follows (no agent behind it) creates no schedulable node and
    is marked gone after node_gone_seconds; a node whose agent beats is not."""
    settings = env.settings(HealthSettings, join_batch_seconds=0, check_interval_seconds=0.2,
                            check_deadline_seconds=60, node_gone_seconds=2.0, evaluate_interval_seconds=0.5)
    s = settings.subjects
    pg = await asyncpg.connect(env.database_url)
    try:
        async with running(serve, settings), jetstream(settings.nats_url) as (nc, js), \
                collect(settings.nats_url, s.node_all) as nodes:
            for name in ("phantom", "alive"):
                await publish(js, s.node(f"node-{name}", "registered"), registration(name))

            async def beat_alive() -> None:
                while True:
                    await publish(js, s.heartbeat("ex-alive"), Heartbeat(
                        executor_id="ex-alive", node_id="node-alive", group="g1", phase=Phase.IDLE,
                        sent_at=datetime.now(UTC), interval_seconds=0.5, progress_interval_seconds=0.5,
                        accepting=True))
                    await asyncio.sleep(0.5)

            beating = asyncio.create_task(beat_alive())
            try:
                await eventually(lambda: asyncio.sleep(0, "gone" in [e.event.value for e in
                                                                     events_of(nodes, "node-phantom")]), timeout=15)
                # Many ticks have passed: the beating node is still there, checking (no agent runs its suite).
                assert "gone" not in [e.event.value for e in events_of(nodes, "node-alive")]
                row = await pg.fetchrow("SELECT state, schedulable, reason FROM health.nodes_public"
                                        " WHERE node_id = 'node-phantom'")
                assert row["state"] == "gone" and not row["schedulable"] and "no heartbeat" in row["reason"]
                assert not any(e.schedulable for e in events_of(nodes, "node-phantom"))
                alive = await pg.fetchval("SELECT state FROM health.nodes WHERE node_id = 'node-alive'")
                assert alive in ("joining", "checking")
            finally:
                beating.cancel()
    finally:
        await pg.close()
