"""The agent's side of a Slurm pilot: who it is (agents/executor/pilot.py), what a run is told of its allocation,
the settings a pilot is given (teto/slurm/cli.py), and the test fault read at each check run."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from agents.executor import main as main_module
from agents.executor import pilot
from agents.executor.checks import faults
from agents.executor.settings import ExecutorSettings
from teto.slurm.cli import agent_settings
from tests.support.services import eventually

PILOT_ENV = {"TETO_SLURM_PILOT": "1", "SLURM_JOB_ID": "77", "SLURMD_NODENAME": "n3",
             "TETO_SLURM_SIGNAL_LEAD_SECONDS": "90"}


def test_a_pilot_knows_its_job_node_and_lead():
    assert pilot.of(PILOT_ENV) == pilot.Pilot("77", "n3", 90.0)
    assert pilot.of({**PILOT_ENV, "TETO_SLURM_SIGNAL_LEAD_SECONDS": "soon"}) == pilot.Pilot("77", "n3", 0.0)
    assert pilot.of({k: v for k, v in PILOT_ENV.items() if k != "TETO_SLURM_PILOT"}) is None
    assert pilot.of({}) is None


def test_a_pilots_agent_takes_its_ids_from_slurm_unless_given_its_own(monkeypatch):
    for k, v in {**PILOT_ENV, "SLURM_CLUSTER_NAME": "hpc"}.items():
        monkeypatch.setenv(k, v)
    s = ExecutorSettings.from_env(env={})
    assert (s.executor_id, s.node_id) == ("slurm-hpc-77", "n3-77")
    s = ExecutorSettings.from_env(env={}, executor_id="mine", node_id="here")
    assert (s.executor_id, s.node_id) == ("mine", "here")
    monkeypatch.delenv("TETO_SLURM_PILOT")
    assert ExecutorSettings.from_env(env={}).executor_id != "slurm-hpc-77"


def test_a_run_is_told_its_allocation_and_warned_when_its_ceiling_outlasts_it():
    p = pilot.Pilot("77", "n3", 90.0)
    fits = pilot.allocation(p, 7200.0, 3600.0, 1)
    assert fits == {"scheduler": "slurm", "job_id": "77", "node": "n3", "time_left_seconds": 7200.0,
                    "signal_lead_seconds": 90.0}
    short = pilot.allocation(p, 1800.0, 3600.0, 1)
    assert "outlasts this pilot's Slurm allocation" in short["warning"]
    assert "warning" not in pilot.allocation(p, None, 3600.0, 1)


def test_a_pilot_is_given_the_agents_settings_and_not_the_services_secrets():
    environ = {"TETO_NATS_URL": "nats://bus:4222", "TETO_NATS_CREDENTIALS_FILE": "/secure/executor.creds",
               "TETO_SECRETS_KEY": "/secure/key", "TETO_DATABASE_URL": "postgresql://x", "TETO_DATABASE_URL_FILE": "/x",
               "TETO_TOKENS_FILE": "/t", "TETO_EXECUTOR_ID": "laptop", "TETO_NODE_ID": "laptop",
               "TETO_PROVISIONER_COMMAND": "x", "TETO_SLURM_PILOT_DIR": "/p", "TETO_TOKEN": "secret",
               "PATH": "/usr/bin", "HOME": "/home/u", "AWS_SECRET_ACCESS_KEY": "no", "TETO_LEASE_SECONDS": "60"}
    out = agent_settings(environ, "hpc", 120, {"TETO_TORCH_THREADS": "8"})
    assert out == {"TETO_NATS_URL": "nats://bus:4222", "TETO_NATS_CREDENTIALS_FILE": "/secure/executor.creds",
                   "TETO_SECRETS_KEY": "/secure/key", "TETO_LEASE_SECONDS": "60", "PATH": "/usr/bin",
                   "HOME": "/home/u", "TETO_SLURM_PILOT": "1", "TETO_GROUP": "hpc",
                   "TETO_SLURM_SIGNAL_LEAD_SECONDS": "120", "TETO_TORCH_THREADS": "8"}


def test_the_test_fault_file_is_read_at_each_check_run(tmp_path):
    assert faults.spec_of("membw:slow", None) == "membw:slow"
    f = tmp_path / "fault"
    assert faults.spec_of("", f) == ""  # no file yet: no fault
    f.write_text("matmul:fail\n")
    assert faults.parse(faults.spec_of("membw:slow", f)) == {"membw": "slow", "matmul": "fail"}
    f.write_text("")
    assert faults.spec_of("", f) == ""
    (tmp_path / "n1").write_text("matmul:fail")
    assert faults.spec_of("", tmp_path, "n1") == "matmul:fail" and faults.spec_of("", tmp_path, "n2") == ""
    assert faults.spec_of("", Path("/nonexistent/dir/file")) == ""


def test_a_pilots_signals_make_it_leave_and_a_sigterm_while_leaving_ends_it():
    """SIGUSR1 (the --signal lead) resolves the agent's ``leave`` with the reason; the agent then checkpoints and
    stops its run. A SIGTERM while it is leaving (the limit itself, a second scancel) cancels it at once."""
    seen: list[str] = []

    async def serve(leave):
        seen.append(await leave)
        await asyncio.Event().wait()  # a checkpoint that takes too long

    async def main() -> bool:
        task = asyncio.create_task(main_module._until_signalled(serve, as_pilot=True))
        await asyncio.sleep(0)  # its handlers are installed as it starts
        os.kill(os.getpid(), signal.SIGUSR1)
        await eventually(lambda: asyncio.sleep(0, seen), timeout=5, what="the leave to be resolved")
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(task, 5)
        return task.done()

    assert asyncio.run(main())
    assert seen == ["Slurm sent SIGUSR1: the allocation ends"]
