"""What bounds the overshoot past a GPU ceiling, on the executor's side, against a real NATS server (the test
plays the queue): usage is charged only while the training process runs (nothing before the grant, nothing
after the process is gone), and a process that ignores the stop is killed once the grace the stop carries
has passed, so the time charged after a stop is at most the grace plus one usage-report interval."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path

import pytest

from agents.executor.runner import Child
from agents.executor.settings import ExecutorSettings
from libs.contracts.agents import StopJob
from libs.contracts.telemetry import RunOutcome
from libs.runtime import bus

from tests.integration.helpers_executor import agent_with_fake_queue, command
from tests.support.services import eventually

pytestmark = pytest.mark.integration

GRACE = 1.5
# Ignores SIGTERM (as a careless training script might) and never reports: only SIGKILL ends it.
DEAF = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
        "while True:\n    time.sleep(0.05)\n")


@pytest.fixture
async def executor(env):
    """A running agent (whose own stop grace, 30 s, the stop's grace must override), a NATS connection for the
    test, and the fake queue."""
    settings = env.settings(ExecutorSettings, executor_id=f"ex-{uuid.uuid4().hex[:6]}", stop_grace_seconds=30)
    async with agent_with_fake_queue(settings) as stack:
        yield stack


async def _stop(js, settings, job: str) -> None:
    await bus.publish(js, settings.subjects.agent(settings.executor_id, "stop"),
                      StopJob(job_id=job, epoch=1, reason="gpu_ceiling", checkpoint_first=True, grace_seconds=GRACE))


async def test_a_process_deaf_to_the_stop_is_killed_after_the_grace_and_charged_only_while_it_ran(executor):
    settings, js, queue = executor
    job = uuid.uuid4().hex
    # Idle heartbeats charge nothing.
    await eventually(lambda: len(queue.heartbeats) >= 2, 10, "idle heartbeats")
    assert queue.usage == []

    granted_at = time.monotonic()
    await queue.grant(js, settings, job, command({}, sys.executable, "-c", DEAF))
    await eventually(lambda: queue.of(job, "started"), 20, "the process to start")
    await eventually(lambda: queue.records(job), 10, "usage while it runs")
    stop_at = time.monotonic()
    # The stop carries the grace (the queue's setting), which wins over the agent's own default of 30 s.
    await _stop(js, settings, job)
    done = await queue.wait_finished(job, timeout=20)
    stopped_in = time.monotonic() - stop_at
    # SIGKILL after the grace, as a shell reports it (the guard passes the command's status on: 128 + 9)
    assert done.outcome is RunOutcome.STOPPED and done.exit_code == 137, done
    assert GRACE <= stopped_in < GRACE + 3 * settings.heartbeat_seconds, stopped_in

    # The run's last stretch arrives as a final usage record; then nothing more.
    def samples() -> list:
        return queue.records(job)

    ended_at, seen = time.monotonic(), len(queue.heartbeats)
    await eventually(lambda: [r for r in samples() if r.last] and [h for h in queue.heartbeats[seen:] if h.accepting],
                     10, "the run's last usage record and an idle heartbeat after it")
    final = samples()
    await asyncio.sleep(2 * settings.heartbeat_seconds)
    assert samples() == final  # nothing charged once the process is gone
    assert [u.seq for u in final] == list(range(1, len(final) + 1))
    charged = sum(u.wall_seconds for u in final)
    # Charged: from the process's start to its death, which includes the whole grace it ignored, and never
    # more than the time since the grant (time before the process started is not charged either).
    assert GRACE <= charged <= ended_at - granted_at, (charged, ended_at - granted_at)


async def test_a_stop_that_arrives_while_the_process_is_being_started_still_stops_it(executor, monkeypatch):
    settings, js, queue = executor
    real_start = Child.start

    async def start_after_the_stop(launch, on_report, sandbox=None, **kw):
        # Hold the start until the agent has taken the stop (it writes the stop file first): the stop lands
        # while there is no process to signal yet.
        stop_file = Path(launch.env["TETO_STOP_FILE"])
        await eventually(stop_file.exists, timeout=15, what="the agent to take the stop", every=0.02)
        return await real_start(launch, on_report, sandbox, **kw)

    monkeypatch.setattr(Child, "start", staticmethod(start_after_the_stop))
    job = uuid.uuid4().hex
    await queue.grant(js, settings, job, command({}, sys.executable, "-c", DEAF))
    await eventually(lambda: queue.renewals, 10, "the grant to be confirmed")
    await _stop(js, settings, job)
    done = await queue.wait_finished(job, timeout=20)
    # SIGTERM (143 = 128 + 15, as the guard passes the command's death on), or SIGKILL after the grace (137) if
    # the script already ignored it.
    assert done.outcome is RunOutcome.STOPPED and done.exit_code in (143, 137), done

