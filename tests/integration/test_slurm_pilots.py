"""Teto on a real Slurm cluster (Debian's slurm-wlm and munge; tests/support/slurm.py starts one slurmctld and
five ``slurmd -N nK`` on this machine, installing the packages first when they are missing), with real NATS and
PostgreSQL and the real health and queue services in this process. The agents are Slurm pilot jobs submitted
by ``teto slurm provision``'s code; every fact about Slurm is read back from Slurm itself (squeue, scontrol).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from libs.contracts.commands import SubmitJob
from libs.contracts.jobs import JobSpec
from libs.slurm.pilot import PilotRequest
from services.health.app import serve as health_serve
from services.health.settings import HealthSettings
from services.queue.settings import QueueSettings
from teto.slurm import cli as slurm_cli
from tests.e2e.stack import shared_base_dir
from tests.integration.helpers_executor import finetune
from tests.integration.helpers_hba import running
from tests.integration.helpers_queue import client, eventually, queue_service
from tests.support.slurm import GPUS_PER_NODE, PARTITION, SlurmCluster, slurm_cluster

pytestmark = pytest.mark.integration
GROUP = "slurm"


@pytest.fixture
def slurm(tmp_path_factory) -> SlurmCluster:
    root = Path(tmp_path_factory.mktemp("slurm"))
    with slurm_cluster(root, nodes=5) as cluster:
        yield cluster


@dataclass
class Site:
    """The test's Slurm cluster and Teto's services, with the pilots' directory."""

    slurm: SlurmCluster
    pilot_dir: Path
    c: Any  # the queue client (commands, job views, the database)

    def provision(self, nodes: int, **request: Any) -> list[str]:
        req = PilotRequest(partition=PARTITION, gpus_per_node=GPUS_PER_NODE, group=GROUP, **request)
        settings = slurm_cli.agent_settings(self.agent_env, GROUP, req.signal_lead_seconds, {})
        return slurm_cli.provision(self.pilot_dir, req, nodes, settings, env=self.slurm.env)

    agent_env: dict[str, str] = None  # type: ignore[assignment]

    def pilots(self) -> list[dict[str, str]]:
        return [j for j in self.slurm.jobs() if j["name"] == "teto-pilot"]

    async def teto_nodes(self) -> list[dict[str, Any]]:
        return [dict(r) for r in await self.c.db.fetch("SELECT * FROM health.nodes_public ORDER BY node_id")]

    async def ready_nodes(self) -> list[dict[str, Any]]:
        return [n for n in await self.teto_nodes() if n["state"] == "ready"]

    def pilot_logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.pilot_dir.glob("pilot-*.out")))


@contextlib.asynccontextmanager
async def site(env, slurm: SlurmCluster, tmp_path: Path, **health: Any) -> AsyncIterator[Site]:
    pilot_dir = tmp_path / "pilots"
    hs = env.settings(HealthSettings, join_batch_seconds=1.5, check_interval_seconds=0.3, max_reboots=1,
                      min_ratio=0.05, evaluate_interval_seconds=0.5, **health)
    qs = env.settings(QueueSettings, schedule_interval_seconds=0.2)
    agent_env = env.env_vars(TETO_TORCH_THREADS="1", TETO_CHECK_TIMEOUT_SECONDS="120",
                             TETO_PROGRESS_INTERVAL_SECONDS="0.5", TETO_ADVERTISE_HOST="127.0.0.1",
                             TETO_BASE_MODEL_DIR=str(shared_base_dir()), TETO_STOP_GRACE_SECONDS="10",
                             **{"SLURM_CONF": str(slurm.conf)})
    async with running(health_serve, hs), queue_service(qs), client(qs) as c:
        s = Site(slurm, pilot_dir, c)
        s.agent_env = agent_env
        try:
            yield s
        except BaseException:
            print(s.pilot_logs())
            print(slurm.log())
            raise
        finally:
            with contextlib.suppress(Exception):
                slurm_cli.release([], env=slurm.env)
            # The pilots checkpoint and leave on scancel's SIGTERM; wait for them before the services go.
            with contextlib.suppress(Exception):
                await eventually(lambda: asyncio.sleep(0, not s.pilots()), timeout=60)


async def test_pilots_run_fine_tunes_inside_slurm_jobs(env, slurm, tmp_path):
    async with site(env, slurm, tmp_path) as s:
        jobs = s.provision(4)
        assert len(jobs) == 4

        # Each pilot runs as a Slurm job on its own node and registers with its Slurm node name and job id.
        await eventually(lambda: asyncio.sleep(0, len([p for p in s.pilots() if p["state"] == "RUNNING"]) == 4),
                         timeout=60, what="4 pilots running in Slurm")
        running_pilots = {p["job_id"]: p["node"] for p in s.pilots()}
        assert sorted(running_pilots) == sorted(jobs) and len(set(running_pilots.values())) == 4
        await eventually(lambda: _count(s.ready_nodes(), 4), timeout=240, what="4 pilots' nodes ready")
        nodes = await s.teto_nodes()
        assert sorted((n["hostname"], n["slurm_job_id"]) for n in nodes) == sorted(
            (node, job) for job, node in running_pilots.items())

        # The settings file is the owner's alone; no setting is on the pilots' command lines.
        assert oct(os.stat(s.pilot_dir / "pilot.env").st_mode & 0o777) == "0o600"
        assert oct(os.stat(s.pilot_dir).st_mode & 0o777) == "0o700"
        for job in jobs:
            command = slurm.run("scontrol", "show", "job", job, "--oneliner").stdout
            assert env.infra.nats_url not in command and "TETO_" not in command, command

        # Fine-tunes run inside the pilots' Slurm jobs and succeed.
        ids = [f"ft{i}" for i in range(4)]
        for job_id in ids:
            spec = JobSpec(workload=finetune(30), checkpoint_every_steps=10)
            assert (await s.c.command(SubmitJob(actor="t", job_id=job_id, spec=spec))).accepted
        for job_id in ids:
            await s.c.wait_state(job_id, "succeeded", timeout=240)
        executors = {(await s.c.job(j))["executor_id"] for j in ids}
        pilot_executors = {f"slurm-{_cluster(slurm)}-{job}" for job in jobs}
        assert executors <= pilot_executors, (executors, pilot_executors)
        started = [r for j in ids for r in await s.c.event_rows(j) if r["event"] == "started"]
        allocations = [json.loads(r["detail"])["allocation"] if isinstance(r["detail"], str)
                       else r["detail"]["allocation"] for r in started]
        assert {a["job_id"] for a in allocations} <= set(jobs) and all(a["scheduler"] == "slurm"
                                                                       for a in allocations)

        # teto slurm status: each pilot's Slurm state beside its Teto node's state.
        view = slurm_cli.status(await s.teto_nodes(), env=slurm.env)
        rows = {r["job_id"]: r for r in view["pilots"]}
        assert sorted(rows) == sorted(jobs)
        assert {(r["slurm_state"], r["teto_state"], r["phase"]) for r in rows.values()} == {
            ("RUNNING", "ready", "running")}
        assert view["drained_by_teto"] == []

        # teto slurm release: the pilots end (each leaves on scancel's SIGTERM), and their nodes are idle again.
        slurm_cli.release([], env=slurm.env)
        await eventually(lambda: asyncio.sleep(0, not s.pilots()), timeout=60, what="the pilots to end")
        assert {slurm.node(n)["State"] for n in slurm.nodes} == {"IDLE"}


async def _count(coro, n: int) -> bool:
    return len(await coro) >= n


def _cluster(slurm: SlurmCluster) -> str:
    return slurm_cli.cluster_name(slurm.env) or "slurm"
