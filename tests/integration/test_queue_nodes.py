"""The queue places work only on nodes the health service reports schedulable: an executor whose node has not
passed its checks, or is cordoned, gets nothing; the same executor gets the job once its node is ready."""

from __future__ import annotations

import pytest

from libs.contracts.commands import SubmitJob
from libs.contracts.jobs import FinetuneWorkload, JobSpec
from services.queue.settings import QueueSettings

from tests.integration.helpers_queue import FakeExecutor, client, queue_service
from tests.support.services import eventually

pytestmark = pytest.mark.integration


async def test_work_goes_only_to_schedulable_nodes(env):
    settings = env.settings(QueueSettings, schedule_interval_seconds=0.1)
    async with queue_service(settings), client(settings) as c:
        ex = FakeExecutor(c, "ex-a")
        ex.node_ready = _no_node_event  # start() must not announce the node ready: this test decides
        await ex.start()
        await FakeExecutor.node_ready(ex, schedulable=False, seq=1)  # e.g. checking, or cordoned
        out = await c.command(SubmitJob(actor="ann", job_id="j1", spec=JobSpec(workload=FinetuneWorkload())))
        assert out.accepted
        await eventually(lambda: c.db.fetchval("SELECT count(*) FROM queue.executors WHERE executor_id = 'ex-a'"))
        await eventually(lambda: c.db.fetchval("SELECT NOT schedulable FROM queue.nodes WHERE node_id = 'node-ex-a'"))
        for _ in range(5):  # several placement passes with the executor free and heartbeating
            await c.db.execute("SELECT pg_sleep(0.2)")
        assert await c.state("j1") == "queued"
        await FakeExecutor.node_ready(ex, schedulable=True, seq=2)
        run = await ex.take(timeout=10)
        assert run.job_id == "j1" and run.executor_id == "ex-a"
        # An older event redelivered does not undo the newer one.
        await FakeExecutor.node_ready(ex, schedulable=False, seq=1)
        await c.db.execute("SELECT pg_sleep(0.3)")
        assert await c.db.fetchval("SELECT schedulable FROM queue.nodes WHERE node_id = 'node-ex-a'")
        await ex.stop()


async def _no_node_event(*args, **kwargs) -> None:
    return None
