"""A resume's checkpoint verification in the agent (issue 26 item 3): a run stopped while its checkpoint is being
hashed (a cancel, its GPU ceiling, a lost lease, the agent's shutdown) ends at once instead of after the hash, and
the verification's time is charged to the job from its start, as the process's time would be."""

from __future__ import annotations

import asyncio
import json

import pytest

from agents.executor import supervision
from agents.executor import checkpoints
from agents.executor import run as run_module
from agents.executor.agent import Agent
from agents.executor.lease import LeaseLost
from agents.executor.run import Run
from agents.executor.settings import ExecutorSettings
from libs.contracts.agents import AcceptedCheckpoint, RunJob, StopJob
from libs.contracts.leases import LeaseRenewReply
from libs.contracts.telemetry import RunOutcome
from tests.support import builders
from tests.support.services import eventually

pytestmark = pytest.mark.unit

HUGE = 60 * 2**30  # within the default 64 GiB quota: hashed (minutes of reading zeros) unless stopped


def grant(**kw) -> RunJob:
    # The queue accepted the huge checkpoint (ckpt_fence.py): it is the one to verify before the run resumes.
    return builders.grant(attempt=2, resume_from=AcceptedCheckpoint(step=5, sha256="0" * 64), **kw)


@pytest.fixture
def seen(monkeypatch, tmp_path):
    """An agent whose grant is confirmed at once and whose job directory holds a huge sparse checkpoint with a
    sidecar claiming its size; what it finished with, and whether a sandbox was ever opened."""
    seen: dict = {"finished": [], "opened": 0, "lost": asyncio.Event()}

    class Keeper:
        def __init__(self, *args, **kwargs) -> None:
            pass

        async def acquire(self):
            return LeaseRenewReply(ok=True)

        async def watch(self):
            await seen["lost"].wait()
            return LeaseLost("lease refused: stale epoch", refused=True)

    def open_for(*args, **kwargs):
        seen["opened"] += 1
        raise AssertionError("a sandbox for a run stopped while verifying")

    monkeypatch.setattr(supervision, "LeaseKeeper", Keeper)
    monkeypatch.setattr(run_module.sandbox, "open_for", open_for)
    agent = Agent(ExecutorSettings.from_env(env={}, data_dir=tmp_path, executor_id="ex-1"), None, None, [])
    path = checkpoints.checkpoint_path(agent.settings.effective_checkpoint_dir / "j1", 5)
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        f.truncate(HUGE)
    checkpoints.sidecar_path(path).write_text(json.dumps({"step": 5, "sha256": "0" * 64, "bytes": HUGE}))

    async def finish(run: Run, outcome: RunOutcome, rc, error) -> None:  # noqa: ANN001
        seen["finished"].append((outcome, run.stop_reason, error))

    agent._finish = finish
    seen["agent"] = agent
    return seen


def _charged(agent: Agent) -> list:
    return [(r.job_id, r.epoch, r.last) for r in agent.usage.meter.due(100)]


async def test_a_cancel_during_verification_ends_the_run_at_once_and_its_time_is_charged(seen):
    agent: Agent = seen["agent"]
    run = Run(grant())
    agent.run = run
    task = asyncio.create_task(agent._serve_grant(run))
    await eventually(lambda: agent.usage.meter.running, timeout=10, what="the verification to be metered")
    agent.on_stop(StopJob(job_id="j1", epoch=1, reason="cancelled", grace_seconds=1))
    await asyncio.wait_for(task, 30)  # the hash of 60 GiB would take minutes
    assert seen["finished"] == [(RunOutcome.STOPPED, "cancelled",
                                 "stopped while its checkpoint was being verified, before the process started")]
    assert _charged(agent)[-1] == ("j1", 1, True) and agent.usage.meter.due(100)[-1].wall_seconds > 0
    assert seen["opened"] == 0 and agent.run is None and not agent.usage.meter.running


async def test_a_ceiling_spent_during_verification_stops_it(seen):
    agent: Agent = seen["agent"]
    run = Run(grant(remaining_gpu_seconds=0.2))
    agent.run = run
    await asyncio.wait_for(agent._serve_grant(run), 30)
    assert [(o, r) for o, r, _ in seen["finished"]] == [(RunOutcome.STOPPED, "gpu_ceiling")]
    assert sum(r.wall_seconds for r in agent.usage.meter.due(100)) >= 0.2


async def test_a_lease_lost_during_verification_abandons_the_run_at_once(seen):
    agent: Agent = seen["agent"]
    run = Run(grant())
    agent.run = run
    task = asyncio.create_task(agent._serve_grant(run))
    await eventually(lambda: agent.usage.meter.running, timeout=10, what="the verification to be metered")
    seen["lost"].set()
    await asyncio.wait_for(task, 30)
    assert seen["finished"] == [(RunOutcome.ABANDONED, None, "lease refused: stale epoch")]
    assert _charged(agent)[-1] == ("j1", 1, True)


async def test_an_agent_shut_down_during_verification_does_not_wait_for_the_hash(seen):
    agent: Agent = seen["agent"]
    run = Run(grant())
    agent.run = run
    task = asyncio.create_task(agent._serve_grant(run))
    await eventually(lambda: agent.usage.meter.running, timeout=10, what="the verification to be metered")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)
    assert _charged(agent)[-1] == ("j1", 1, True) and seen["opened"] == 0
