"""Item 8, the ceiling to the second, on the executor's side against a real NATS server with no budget service
and no queue at all (the test plays the queue's grant and lease renewals, and never sends a stop): a grant that
carries the GPU-seconds left is stopped by the agent's own monotonic clock, checkpoint-first, and reported as a
ceiling stop, with an overshoot bounded by the settings (1 s + the grace + a usage tick), well under one
heartbeat, where before the budget and queue could only react to a heartbeat's usage report."""

from __future__ import annotations

import sys
import uuid

import pytest

from agents.executor.ceiling import CEILING_STOP
from agents.executor.settings import ExecutorSettings
from libs.contracts.agents import RunJob
from libs.contracts.jobs import JobSpec
from libs.contracts.telemetry import RunOutcome
from libs.runtime import bus

from tests.integration.helpers_executor import agent_with_fake_queue, command
from tests.support.services import eventually

pytestmark = pytest.mark.integration

HEARTBEAT = 5.0  # long, so a heartbeat-paced stop would overshoot by seconds
GRACE = 1.5
REMAINING = 3.0  # GPU-seconds left at grant time; a CPU-only worker is one device
SLACK = 0.5  # the process's own exit and the final usage record's rounding
# Checkpoints on SIGTERM (writes a marker) and exits at once, as the built-in fine-tune does on a stop.
POLITE = ("import os, signal, sys, time\n"
          "def stop(*_):\n    open(os.environ['MARK'], 'w').write('checkpointed'); sys.exit(0)\n"
          "signal.signal(signal.SIGTERM, stop)\nprint('ready', flush=True)\n"
          "while True:\n    time.sleep(0.02)\n")


@pytest.fixture
async def executor(env):
    settings = env.settings(ExecutorSettings, executor_id=f"ex-{uuid.uuid4().hex[:6]}", stop_grace_seconds=GRACE,
                            heartbeat_seconds=HEARTBEAT, lease_seconds=30.0, stop_margin_seconds=5.0)
    async with agent_with_fake_queue(settings) as stack:
        yield stack


async def _grant(js, settings, job: str, workload, remaining: float | None) -> None:
    msg = RunJob(job_id=job, epoch=1, executor_id=settings.executor_id, attempt=1,
                 spec=JobSpec(workload=workload, checkpoint_every_steps=5), lease_seconds=settings.lease_seconds,
                 heartbeat_seconds=settings.heartbeat_seconds, remaining_gpu_seconds=remaining)
    await bus.publish(js, settings.subjects.agent(settings.executor_id, "run"), msg)


async def test_the_executor_stops_at_the_remaining_gpu_seconds_by_its_own_clock(executor, tmp_path):
    settings, js, queue = executor
    job, mark = uuid.uuid4().hex, tmp_path / "mark"
    await _grant(js, settings, job, command({"MARK": str(mark)}, sys.executable, "-c", POLITE), REMAINING)
    done = await queue.wait_finished(job, timeout=30)
    assert done.outcome is RunOutcome.STOPPED and done.stop_reason == CEILING_STOP, done
    assert mark.read_text() == "checkpointed"  # the stop was checkpoint-first (SIGTERM, not a kill)
    await eventually(lambda: [r for r in queue.records(job) if r.last], 15, "the run's last usage record")
    charged = sum(r.wall_seconds * r.devices for r in queue.records(job))
    overshoot = charged - REMAINING
    # Bounded by the settings, not by the heartbeat: before, the stop could only follow a usage report.
    assert -0.05 <= overshoot <= 1.0 + GRACE + SLACK, (charged, overshoot)
    assert overshoot < HEARTBEAT


async def test_without_the_remaining_seconds_the_executor_waits_for_a_stop_as_before(executor, tmp_path):
    settings, js, queue = executor
    job = uuid.uuid4().hex
    await _grant(js, settings, job, command({"MARK": str(tmp_path / "m")}, sys.executable, "-c", POLITE), None)
    await eventually(lambda: queue.of(job, "started"), 20, "the process to start")
    await eventually(lambda: sum(r.wall_seconds for r in queue.records(job)) > REMAINING + 1.0 + GRACE + SLACK,
                     30, "the run to go on past where a known ceiling would have stopped it")
    assert not queue.finished(job)
    await queue.stop_job(js, job, 1, checkpoint_first=True)
    done = await queue.wait_finished(job, timeout=20)
    assert done.outcome is RunOutcome.STOPPED and done.stop_reason == "test"
