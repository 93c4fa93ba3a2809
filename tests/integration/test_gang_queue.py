"""Gangs at the queue with played executors: the gang policy command (stored once, answered, audited by the
real audit service) and a node failure reported by the health service under a running gang."""

from __future__ import annotations

import pytest

from libs.contracts.agents import StopJob
from libs.contracts.commands import SetGangPolicy, SubmitJob
from libs.contracts.envelope import new_id
from libs.contracts.nodes import NodeEvent
from libs.contracts.policies import GangPolicy
from libs.contracts.telemetry import WorkerReady
from libs.runtime.bus import publish
from services.audit.app import serve as audit_serve
from services.audit.settings import AuditSettings
from services.queue.settings import QueueSettings
from tests.integration.helpers_queue import FakeExecutor, client, queue_service
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration


async def test_set_policy_is_stored_once_answered_and_audited(env):
    settings = env.settings(QueueSettings, require_checked_nodes=False)
    policy = GangPolicy(ready_timeout_seconds=45, backoff_base_seconds=2, backoff_max_seconds=8, backoff_limit=None,
                        sequential_admission=False, node_failure_strategy="fail_job")
    cmd = SetGangPolicy(actor="root-admin", policy=policy)
    async with queue_service(settings), running(audit_serve, env.settings(AuditSettings)), client(settings) as c:
        assert await c.db.fetchval("SELECT count(*) FROM queue.gang_policy_public") == 0  # defaults until set
        outcome = await c.command(cmd)
        assert outcome.accepted and outcome.detail["policy"] == policy.model_dump(mode="json")
        row = await c.db.fetchrow("SELECT * FROM queue.gang_policy_public")
        assert GangPolicy.model_validate({k: row[k] for k in GangPolicy.model_fields}) == policy
        assert row["updated_by"] == "root-admin"
        # The same command again (a retried PUT) acts once and is answered with the same outcome.
        again = await c.command(cmd.model_copy(update={"policy": GangPolicy(), "id": new_id()}))
        assert again.accepted and again.detail == outcome.detail
        assert (await c.db.fetchrow("SELECT * FROM queue.gang_policy_public"))["backoff_limit"] is None

        async def audited() -> list:
            rows = await c.db.fetch("SELECT * FROM audit.log_public WHERE kind = 'set_policy' ORDER BY seq")
            return rows if {r["outcome"] for r in rows} >= {"received", "accepted"} else []

        rows = await eventually(audited, 20)
        assert {r["actor"] for r in rows} == {"root-admin"} and {r["command_id"] for r in rows} == {cmd.command_id}


async def test_a_failed_node_event_under_a_running_gang_requeues_it_at_once(env):
    """Played executors: the gang forms (every worker ready), then the health service fails one node; the
    queue requeues the gang without waiting for a lease and tells the other workers to stop."""
    settings = env.settings(QueueSettings, schedule_interval_seconds=0.1, require_checked_nodes=False)
    async with queue_service(settings), client(settings) as c:
        workers = [await FakeExecutor(c, f"gx-{i}").start() for i in range(3)]
        try:
            sub = SubmitJob(actor="ann", spec={"workload": {"kind": "finetune"}, "workers": 3})
            assert (await c.command(sub)).accepted
            grants = [await w.take() for w in workers]
            assert sorted(g.rank for g in grants) == [0, 1, 2] and {g.world_size for g in grants} == {3}
            assert len({g.rendezvous for g in grants}) == 1 and grants[0].ready_timeout_seconds == 120
            assert await c.state(sub.job_id) == "admitting"
            for w in workers:
                await w.report(WorkerReady(job_id=sub.job_id, epoch=w.epoch, executor_id=w.id, rank=0, world_size=3))
            await c.wait_state(sub.job_id, "running")
            failed = NodeEvent(node_id="node-gx-1", seq=2, event="failed", state="failed", executor_id="gx-1",
                               group="default", schedulable=False, reason="ecc errors")
            await publish(c.js, c.s.node(failed.node_id, "failed"), failed)
            job = await c.wait_state(sub.job_id, "queued")
            assert job["attempts"]["node_failure"] == 1 and job["attempts"]["training_error"] == 0
            for w in (workers[0], workers[2]):
                stop = await w.next_directive()
                assert isinstance(stop, StopJob) and stop.reason == "node_failure"
        finally:
            for w in workers:
                await w.stop()
