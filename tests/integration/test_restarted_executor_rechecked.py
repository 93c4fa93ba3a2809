"""A node judged ready takes work only from the agent start it was judged for (NodeEvent.boot_id against the
heartbeats' boot_id, services/queue/scans.py ``SCHEDULABLE_NODE``). An executor restarted with its stable id (`teto
up` run again, a reboot) heartbeats as a new start before the health service's "joining" for it reaches the queue;
before, placement gave it a job in that window, so the node ran work before its checks (mission 4) and its join
check found it busy (its peers' all-reduce then waited out its timeout: seen as a restarted stack whose second
node stayed "checking" for minutes)."""

from __future__ import annotations

import pytest

from libs.contracts.commands import SubmitJob
from libs.contracts.jobs import JobSpec
from services.queue import scans
from services.queue.settings import QueueSettings
from tests.integration.helpers_queue import FakeExecutor, client, queue_service
from tests.support.services import eventually

pytestmark = pytest.mark.integration


async def test_a_restarted_executor_takes_no_work_until_its_node_is_ready_for_this_start(env):
    settings = env.settings(QueueSettings, heartbeat_seconds=30.0, lease_seconds=180.0, schedule_interval_seconds=0.5)
    async with queue_service(settings), client(settings) as c:
        ex = FakeExecutor(c, "ex-1")
        ex.boot_id = "start-2"  # the agent started again; the node's last "ready" was for its first start
        await ex.start()  # heartbeats (start-2) and a node event "ready"...
        await ex.node_ready(seq=2, boot_id="start-1")  # ...that health had sent for the start before
        free = lambda: scans.queued_and_free(c.db, 60.0)  # noqa: E731
        await eventually(lambda: c.db.fetchval(
            "SELECT e.boot_id = 'start-2' AND n.boot_id = 'start-1' AND n.schedulable FROM queue.executors e"
            " JOIN queue.nodes n ON n.node_id = e.node_id WHERE e.executor_id = 'ex-1'"), what="both rows stored")
        job = SubmitJob(actor="ann", spec=JobSpec(workload={"kind": "command", "command": ["true"]}))
        assert (await c.command(job)).accepted
        assert await free() == (True, 0)  # queued, and no executor free for it: the ready is not this start's
        assert ex.directives.empty()

        await ex.node_ready(seq=3)  # checked again: ready for start-2
        run = await ex.take(timeout=15)
        assert run.job_id == job.job_id


async def test_rows_without_a_boot_id_are_not_compared(env):
    # A release before boot ids (its agents' heartbeats and its health's node events carry none) places as before.
    settings = env.settings(QueueSettings, heartbeat_seconds=30.0, lease_seconds=180.0, schedule_interval_seconds=0.5)
    async with queue_service(settings), client(settings) as c:
        ex = await FakeExecutor(c, "ex-1").start()
        job = SubmitJob(actor="ann", spec=JobSpec(workload={"kind": "command", "command": ["true"]}))
        assert (await c.command(job)).accepted
        assert (await ex.take(timeout=15)).job_id == job.job_id
