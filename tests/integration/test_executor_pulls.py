"""The agent's directive pulls cause no status replies it does not need (issue 12, item 1: messages per job):
each pull asks for one directive and waits for it, never a ``no_wait`` probe answered by "no messages", nor a
request for ten that lingers on the server after the grant and expires with a status message a job."""

from __future__ import annotations

import json
import uuid

import pytest

from agents.executor.settings import ExecutorSettings
from libs.contracts.telemetry import RunOutcome
from tests.integration.helpers_executor import agent_with_fake_queue, command

pytestmark = pytest.mark.integration


async def test_each_directive_pull_asks_for_one_and_lingers_and_jobs_still_run_back_to_back(env):
    settings = env.settings(ExecutorSettings, executor_id=f"ex-{uuid.uuid4().hex[:6]}")
    async with agent_with_fake_queue(settings) as (settings, js, queue):
        pulls: list[dict] = []

        async def seen(msg) -> None:
            if msg.subject.endswith(f"agent-{settings.executor_id}"):
                pulls.append(json.loads(msg.data or b"{}"))

        sub = await queue.nc.subscribe("$JS.API.CONSUMER.MSG.NEXT.>", cb=seen)
        try:
            for _ in range(3):
                job = uuid.uuid4().hex
                await queue.grant(js, settings, job, command({}, "true"))
                done = await queue.wait_finished(job, timeout=30)
                assert done.outcome is RunOutcome.SUCCEEDED, done
        finally:
            await sub.unsubscribe()
    assert pulls, "no pull request seen"
    assert all(p.get("batch") == 1 and not p.get("no_wait") and p.get("expires") for p in pulls), pulls
