"""What bounds the overshoot past a GPU ceiling, on the executor's side, against a real NATS server (the test
plays the queue): usage is charged only while the training process runs (nothing before the grant, nothing
after the process is gone), and a process that ignores the stop is killed once the grace the stop carries
has passed, so the time charged after a stop is at most the grace plus one usage-report interval."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid

import pytest

from agents.executor.agent import serve
from agents.executor.settings import ExecutorSettings
from libs.contracts.agents import StopJob
from libs.contracts.telemetry import RunOutcome
from libs.runtime import bus

from tests.integration.helpers_executor import FakeQueue, command, eventually

pytestmark = pytest.mark.integration

GRACE = 1.5
# Ignores SIGTERM (as a careless training script might) and never reports: only SIGKILL ends it.
DEAF = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
        "while True:\n    time.sleep(0.05)\n")


async def test_a_process_deaf_to_the_stop_is_killed_after_the_grace_and_charged_only_while_it_ran(env, tmp_path):
    settings = env.settings(ExecutorSettings, executor_id=f"ex-{uuid.uuid4().hex[:6]}", stop_grace_seconds=30)
    nc = await bus.connect(settings.nats_url, "test")
    js = nc.jetstream()
    queue = await FakeQueue(nc, settings.subjects, settings.executor_id).start()
    ready = asyncio.Event()
    agent = asyncio.create_task(serve(settings, ready=ready))
    try:
        await asyncio.wait_for(ready.wait(), 30)
        job = uuid.uuid4().hex
        # Idle heartbeats charge nothing.
        await eventually(lambda: len(queue.heartbeats) >= 2, 10, "idle heartbeats")
        assert all(h.usage is None for h in queue.heartbeats)

        granted_at = time.monotonic()
        await queue.grant(js, settings, job, command({}, sys.executable, "-c", DEAF))
        await eventually(lambda: queue.of(job, "started"), 20, "the process to start")
        await eventually(lambda: [h for h in queue.heartbeats if h.usage and h.usage.job_id == job], 10,
                         "usage while it runs")
        stop_at = time.monotonic()
        # The stop carries the grace (the queue's setting), which wins over the agent's own default of 30 s.
        await bus.publish(js, settings.subjects.agent(settings.executor_id, "stop"),
                          StopJob(job_id=job, epoch=1, reason="gpu_ceiling", checkpoint_first=True,
                                  grace_seconds=GRACE))
        done = await queue.wait_finished(job, timeout=20)
        stopped_in = time.monotonic() - stop_at
        assert done.outcome is RunOutcome.STOPPED and done.exit_code == -9, done  # SIGKILL after the grace
        assert GRACE <= stopped_in < GRACE + 3 * settings.heartbeat_seconds, stopped_in

        # The run's last stretch arrives as a final sample with the next heartbeat; then nothing more.
        def samples() -> list:
            return [h.usage for h in queue.heartbeats if h.usage and h.usage.job_id == job]

        ended_at, seen = time.monotonic(), len(queue.heartbeats)
        await eventually(lambda: [h for h in queue.heartbeats[seen:] if h.usage is None and h.accepting], 10,
                         "an idle heartbeat after the run")
        final = samples()
        await asyncio.sleep(2 * settings.heartbeat_seconds)
        assert samples() == final  # nothing charged once the process is gone
        assert [u.seq for u in final] == list(range(1, len(final) + 1))
        charged = sum(u.wall_seconds for u in final)
        # Charged: from the process's start to its death, which includes the whole grace it ignored, and never
        # more than the time since the grant (time before the process started is not charged either).
        assert GRACE <= charged <= ended_at - granted_at, (charged, ended_at - granted_at)
    finally:
        agent.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await agent
        await queue.stop()
        await nc.close()

