"""A command job naming its Python environment (issue 27) run by a real agent: the environment made by
``teto env create``, offered by the agent (TETO_ENVIRONMENTS), runs the command's ``python`` and reaches the SDK;
one the node does not offer cannot start, and the run's error says so."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from agents.executor import launch
from agents.executor.settings import ExecutorSettings
from libs.contracts.agents import RunJob
from libs.contracts.jobs import CommandWorkload, JobSpec
from libs.contracts.telemetry import RunOutcome
from libs.runtime import bus
from teto.cli_env import create
from tests.integration.helpers_executor import agent_with_fake_queue

pytestmark = pytest.mark.integration

SCRIPT = ("import json, os, sys\n"
          "from teto import sdk\n"
          "sdk.report_step(1, total_steps=1, loss=0.5)\n"
          "print('ENV ' + json.dumps({'prefix': sys.prefix, 'executable': sys.executable,"
          " 'virtual_env': os.environ.get('VIRTUAL_ENV')}), flush=True)\n")


async def _grant(js, queue, settings, job: str, environment: str) -> None:
    spec = JobSpec(workload=CommandWorkload(command=["python", "-c", SCRIPT]), environment=environment)
    msg = RunJob(job_id=job, epoch=1, executor_id=settings.executor_id, attempt=1, spec=spec,
                 lease_seconds=settings.lease_seconds, heartbeat_seconds=settings.heartbeat_seconds)
    await bus.publish(js, queue.subjects.agent(settings.executor_id, "run"), msg)


@pytest.fixture
def shared_dir():
    """A directory every user can enter (pytest's own temp root is 0700): where an operator would put it."""
    path = Path(tempfile.mkdtemp(prefix="teto-env-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def test_the_command_runs_in_the_environment_teto_env_create_made(env, shared_dir):
    made = shared_dir / "pyenv"
    lines = create(made, [])
    assert any(f"TETO_ENVIRONMENTS={made}" in line for line in lines), lines
    assert (made / "bin" / "python").stat().st_mode & 0o005 == 0o005  # every user may run it (a+rX)
    settings = env.settings(ExecutorSettings, executor_id=f"ex-{uuid.uuid4().hex[:6]}", progress_interval_seconds=0.3,
                            stop_grace_seconds=3.0, environments=f"{made},/usr/bin/python3")
    async with agent_with_fake_queue(settings) as (settings, js, queue):
        await _eventually_offered(queue, str(made))
        job = uuid.uuid4().hex
        await _grant(js, queue, settings, job, str(made))
        done = await queue.wait_finished(job, timeout=60)
        assert done.outcome is RunOutcome.SUCCEEDED and done.last_step == 1, done
        log = (launch.job_dir(settings, job) / "epoch-1.log").read_text()
        (said,) = [json.loads(line[4:]) for line in log.splitlines() if line.startswith("ENV ")]
        assert said["prefix"] == str(made) and said["virtual_env"] == str(made), said
        assert said["executable"] == str(made / "bin" / "python") and sys.prefix != str(made)

        other = uuid.uuid4().hex
        await _grant(js, queue, settings, other, "/opt/not-here")
        failed = await queue.wait_finished(other, timeout=30)
        assert failed.outcome is RunOutcome.FAILED
        assert "the Python environment /opt/not-here is not offered on this node" in failed.error, failed.error


async def _eventually_offered(queue, path: str) -> None:
    from tests.support.services import eventually

    await eventually(lambda: any(path in hb.environments for hb in queue.heartbeats), 30, "a heartbeat offering it")


def test_env_create_installs_an_extra_reusing_the_installed_torch(shared_dir):
    import importlib.util
    import subprocess

    made = shared_dir / "with-dev"
    lines = create(made, ["dev"])
    installed = [line for line in lines if line.startswith("installed for the extras dev: ")]
    assert installed and "pytest" in installed[0] and " teto[" not in installed[0], lines
    out = subprocess.run([str(made / "bin" / "python"), "-c", "import torch, pytest, teto.sdk; print(torch.__file__)"],
                         capture_output=True, text=True, check=True)
    # the installation's torch, reached through the environment's .pth: never a second copy fetched into it
    assert Path(out.stdout.strip()) == Path(importlib.util.find_spec("torch").origin) and not list(made.glob("lib/python*/site-packages/torch"))
