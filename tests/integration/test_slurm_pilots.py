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
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from libs.contracts.commands import DrainNode, RunHealthCheck, SubmitJob, UndrainNode
from libs.contracts.jobs import JobSpec
from libs.slurm.pilot import PilotRequest
from services.health.app import serve as health_serve
from services.health.settings import HealthSettings
from services.queue.settings import QueueSettings
from teto.slurm import cli as slurm_cli
from tests.e2e.stack import shared_base_dir
from tests.integration.helpers_executor import finetune
from tests.integration.helpers_hba import collect
from tests.integration.helpers_queue import client, queue_service
from tests.support.slurm import GPUS_PER_NODE, PARTITION, SlurmCluster, slurm_cluster
from tests.support.services import eventually, running

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
    audit: Any  # the provisioner's outcomes as published for the audit log

    def provision(self, nodes: int, **request: Any) -> list[str]:
        req = PilotRequest(partition=PARTITION, gpus_per_node=GPUS_PER_NODE, group=GROUP, **request)
        settings = slurm_cli.agent_settings(self.agent_env, GROUP, req.signal_lead_seconds, {})
        return slurm_cli.provision(self.pilot_dir, req, nodes, settings, env=self.slurm.env)

    agent_env: dict[str, str] = None  # type: ignore[assignment]

    def cli(self, *args: str) -> str:
        out = subprocess.run([sys.executable, "-m", "teto.cli", "slurm", *args], capture_output=True, text=True,
                             timeout=60, env=self.agent_env)
        assert out.returncode == 0, out.stderr + out.stdout
        return out.stdout

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
    """The services, with the Slurm provisioner on (it submits replacements from the pilots' directory) and the
    agents' test fault switch in ``<tmp>/faults/<node id>`` (read at every check run)."""
    pilot_dir = tmp_path / "pilots"
    (tmp_path / "faults").mkdir()
    hs = env.settings(HealthSettings, join_batch_seconds=1.5, check_interval_seconds=0.3, max_reboots=1,
                      min_ratio=0.05, evaluate_interval_seconds=0.5, slurm_pilot_dir=pilot_dir, **health)
    qs = env.settings(QueueSettings, schedule_interval_seconds=0.2)
    agent_env = env.env_vars(TETO_TORCH_THREADS="1", TETO_CHECK_TIMEOUT_SECONDS="120",
                             TETO_PROGRESS_INTERVAL_SECONDS="0.5", TETO_ADVERTISE_HOST="127.0.0.1",
                             TETO_BASE_MODEL_DIR=str(shared_base_dir()), TETO_STOP_GRACE_SECONDS="10",
                             TETO_TEST_FAULT_PATH=str(tmp_path / "faults"),
                             **{"SLURM_CONF": str(slurm.conf)})
    os.environ["SLURM_CONF"] = str(slurm.conf)  # the health service's Slurm commands reach this cluster
    async with running(health_serve, hs), queue_service(qs), client(qs) as c, \
            collect(hs.nats_url, f"{hs.subjects.prefix}.outcome.provision.*") as audit:
        s = Site(slurm, pilot_dir, c, audit)
        s.agent_env = agent_env
        try:
            yield s
        except BaseException:
            print(s.pilot_logs())
            print(slurm.log())
            raise
        finally:
            os.environ.pop("SLURM_CONF", None)
            with contextlib.suppress(Exception):
                slurm_cli.release([], env=slurm.env)
            # The pilots checkpoint and leave on scancel's SIGTERM; wait for them before the services go.
            with contextlib.suppress(Exception):
                await eventually(lambda: asyncio.sleep(0, not s.pilots()), timeout=60)


async def test_pilots_run_fine_tunes_inside_slurm_jobs(env, slurm, tmp_path):
    async with site(env, slurm, tmp_path) as s:
        # The command an operator runs, with the agents' settings in its environment.
        out = s.cli("provision", "--partition", PARTITION, "--nodes", "4", "--gpus-per-node", str(GPUS_PER_NODE),
                    "--group", GROUP, "--pilot-dir", str(s.pilot_dir))
        jobs = out.splitlines()[0].split(": ", 1)[1].split()
        assert len(jobs) == 4, out

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
        # The command itself shows the Slurm side even when no gateway answers (and says so).
        cli = json.loads(s.cli("status", "--json", "--url", "http://127.0.0.1:9", "--token", "t", "--timeout", "2"))
        assert sorted((r["job_id"], r["slurm_state"], r["slurm_node"]) for r in cli["pilots"]) == sorted(
            (job, "RUNNING", node) for job, node in running_pilots.items())

        # teto slurm release: the pilots end (each leaves on scancel's SIGTERM), and their nodes are idle again.
        s.cli("release")
        await eventually(lambda: asyncio.sleep(0, not s.pilots()), timeout=60, what="the pilots to end")
        assert {slurm.node(n)["State"] for n in slurm.nodes} == {"IDLE"}


async def test_a_failed_node_is_drained_in_slurm_resumed_when_it_passes_and_replaced_elsewhere(env, slurm, tmp_path):
    async with site(env, slurm, tmp_path, slurm_reboot=True) as s:
        jobs = s.provision(4)
        await eventually(lambda: _count(s.ready_nodes(), 4), timeout=240, what="4 pilots' nodes ready")
        victim = (await s.ready_nodes())[0]
        host, node_id, first_job = victim["hostname"], victim["node_id"], victim["slurm_job_id"]
        fault = tmp_path / "faults" / node_id

        async def teto_state() -> str:
            return (await s.c.db.fetchrow("SELECT state FROM health.nodes WHERE node_id = $1", node_id))["state"]

        async def check(run_id: str) -> None:
            out = await s.c.command(RunHealthCheck(actor="ops", nodes=[node_id], run_id=run_id), timeout=20)
            assert out.accepted, out

        # 1. A fault on the node's check: drained in Slurm with Teto's reason, and rebooted (its agent restarts in
        #    its allocation; Slurm is asked to reboot the node once idle). The fault is gone before it is checked
        #    again: it passes, the pending reboot is cancelled and Slurm resumes the node.
        fault.write_text("matmul:fail")
        await check("r1")
        await eventually(lambda: asyncio.sleep(0, "REBOOT_REQUESTED" in slurm.node(host)["State"]), timeout=120,
                         what=f"{host} drained in Slurm with a reboot requested")
        fault.write_text("")  # the reboot repaired it (before the agent, restarting, is checked again)
        info = slurm.node(host)
        assert "DRAIN" in info["State"] and info["Reason"].startswith("teto: "), info

        def drains() -> list[dict[str, Any]]:  # the audit records, as the outbox relay publishes them
            return [d for m in s.audit.msgs if (d := json.loads(m.data)["detail"])["action"] == "drain"]

        await eventually(lambda: asyncio.sleep(0, drains()), timeout=30, what="the drain's audit record")
        assert drains()[0]["reason"].startswith("teto: matmul failed:"), drains()
        await eventually(lambda: asyncio.sleep(0, "DRAIN" not in slurm.node(host)["State"]), timeout=120,
                         what=f"{host} resumed in Slurm")
        assert "REBOOT" not in slurm.node(host)["State"]
        assert await teto_state() == "ready"
        assert first_job in {p["job_id"] for p in s.pilots()}  # the same pilot: rebooting kept its allocation

        # 2. The fault again, for good: drained, rebooted, failed again, replaced: its pilot ends, the node stays
        #    drained with Teto's reason, and a replacement pilot starts on another node and is checked in.
        fault.write_text("matmul:fail")
        await check("r2")
        await eventually(lambda: _is(teto_state(), "replaced"), timeout=180, what=f"{node_id} replaced")
        await eventually(lambda: asyncio.sleep(0, slurm.job_state(first_job) == "CANCELLED"), timeout=60,
                         what=f"pilot {first_job} ended")
        info = slurm.node(host)  # out for its administrator: drained (and, its pilot gone, the reboot issued)
        assert "DRAIN" in info["State"] and info["Reason"].startswith("teto: "), info
        new = await eventually(lambda: asyncio.sleep(0, [p for p in s.pilots() if p["job_id"] not in jobs
                                                         and p["state"] == "RUNNING"]), timeout=60,
                               what="a replacement pilot running")
        assert new[0]["node"] != host, new
        await eventually(lambda: _ready_job(s, new[0]["job_id"]), timeout=180,
                         what="the replacement's node ready")

        # 3. An operator's drain in Teto drains the Slurm node; undraining it (checked, passed) resumes it.
        other = next(n for n in await s.ready_nodes() if n["hostname"] != host)
        out = await s.c.command(DrainNode(actor="ops", node_id=other["node_id"], reason="disk swap"), timeout=20)
        assert out.accepted, out
        await eventually(lambda: asyncio.sleep(0, "DRAIN" in slurm.node(other["hostname"])["State"]), timeout=60,
                         what="operator's drain reaching Slurm")
        assert slurm.node(other["hostname"])["Reason"] == "teto: drained: disk swap"
        assert (await s.c.command(UndrainNode(actor="ops", node_id=other["node_id"]), timeout=20)).accepted
        await eventually(lambda: asyncio.sleep(0, "DRAIN" not in slurm.node(other["hostname"])["State"]),
                         timeout=120, what="undrained node resumed in Slurm")

        # Every Slurm action is in the audit log's stream with its reason (each record is queued after its action,
        # and published by the outbox relay: the last one may still be on its way).
        def audited() -> list[tuple[str, str]]:
            return [(a["detail"]["action"], a["detail"]["hostname"]) for m in s.audit.msgs
                    if (a := json.loads(m.data))["accepted"]]

        await eventually(lambda: asyncio.sleep(0, ("resume", other["hostname"]) in audited()), timeout=30,
                         what="the last resume in the audit stream")
        actions = [json.loads(m.data) for m in s.audit.msgs]
        done = audited()
        assert done.count(("drain", host)) == 3 and ("resume", host) in done and ("replace", host) in done, done
        assert ("drain", other["hostname"]) in done and ("resume", other["hostname"]) in done, done
        assert done.count(("reboot", host)) == 2, done  # the first failure, and the first after the reboot
        assert all(a["detail"]["reason"] for a in actions)


async def test_a_cancelled_busy_pilot_checkpoints_and_its_job_resumes_on_another_pilot_for_free(env, slurm, tmp_path):
    async with site(env, slurm, tmp_path) as s:
        s.provision(2)
        await eventually(lambda: _count(s.ready_nodes(), 2), timeout=240, what="2 pilots' nodes ready")
        spec = JobSpec(workload=finetune(250, step_delay_seconds=0.1), checkpoint_every_steps=25)
        assert (await s.c.command(SubmitJob(actor="t", job_id="long", spec=spec))).accepted
        job = await _checkpointed(s, "long", 25)
        busy = next(n for n in await s.teto_nodes() if n["executor_id"] == job["executor_id"])

        # scancel: Slurm's SIGTERM reaches the agent, which checkpoints and stops the run before KillWait ends.
        slurm.run("scancel", busy["slurm_job_id"])
        await eventually(lambda: _event(s, "long", "requeued"), timeout=60, what="the job requeued")
        finished = await _progress_end(s, "long", busy["executor_id"])
        assert finished["outcome"] == "stopped", finished
        job = await s.c.job("long")
        assert job["attempts"].get("training_error", 0) == 0 and job["attempts"].get("transport_lost") == 1, job
        stopped_at = finished["last_step"]
        final_ckpt = max(r for r in await _checkpoint_steps(s, "long"))
        assert final_ckpt == stopped_at, (final_ckpt, stopped_at)  # the checkpoint taken as it stopped

        # The other pilot resumes it from that checkpoint, and it succeeds.
        await s.c.wait_state("long", "succeeded", timeout=240)
        starts = [_detail(r) for r in await s.c.event_rows("long") if r["event"] == "started"]
        assert [d["resumed_from_step"] for d in starts] == [None, stopped_at], starts
        assert starts[1]["allocation"]["job_id"] != busy["slurm_job_id"]
        assert slurm.job_state(busy["slurm_job_id"]) == "CANCELLED"


async def test_a_pilot_at_its_time_limit_checkpoints_and_stops_before_the_kill(env, slurm, tmp_path):
    async with site(env, slurm, tmp_path) as s:
        # A pilot of two minutes, told 60 s before its limit (Slurm's --signal), and a job whose ceiling outlasts it.
        [short] = s.provision(1, time_limit="2", signal_lead_seconds=60)
        await eventually(lambda: _count(s.ready_nodes(), 1), timeout=120, what="the short pilot's node ready")
        spec = JobSpec(workload=finetune(600, step_delay_seconds=0.1), checkpoint_every_steps=25,
                       gpu_ceiling_seconds=3600)
        assert (await s.c.command(SubmitJob(actor="t", job_id="long", spec=spec))).accepted
        await s.c.wait_state("long", "running", timeout=60)
        [long_pilot] = s.provision(1)  # where the job goes next
        await eventually(lambda: _started(s, "long", 1), timeout=60, what="the run started")
        first = _detail([r for r in await s.c.event_rows("long") if r["event"] == "started"][0])
        assert first["allocation"]["job_id"] == short and "outlasts this pilot's Slurm allocation" in first[
            "allocation"]["warning"], first

        # The signal lead: the run checkpoints and stops, the pilot leaves on its own (COMPLETED, not TIMEOUT).
        await eventually(lambda: _event(s, "long", "requeued"), timeout=150, what="the job requeued at the lead")
        executor = f"slurm-{_cluster(slurm)}-{short}"
        finished = await _progress_end(s, "long", executor)
        assert finished["outcome"] == "stopped", finished
        assert max(await _checkpoint_steps(s, "long")) == finished["last_step"]
        await eventually(lambda: asyncio.sleep(0, slurm.job_state(short) not in ("RUNNING", "COMPLETING")),
                         timeout=60, what="the short pilot to end")
        assert slurm.job_state(short) == "COMPLETED", slurm.job_state(short)
        job = await s.c.job("long")
        assert job["attempts"].get("training_error", 0) == 0, job
        await eventually(lambda: _started(s, "long", 2), timeout=120, what="the run resumed")
        second = _detail([r for r in await s.c.event_rows("long") if r["event"] == "started"][1])
        assert second["resumed_from_step"] == finished["last_step"] and second["allocation"]["job_id"] == long_pilot
        assert "warning" not in second["allocation"]  # no time limit there


def _detail(row) -> dict[str, Any]:
    d = row["detail"]
    return json.loads(d) if isinstance(d, str) else dict(d)


async def _event(s: Site, job_id: str, event: str) -> bool:
    return any(r["event"] == event for r in await s.c.event_rows(job_id))


async def _started(s: Site, job_id: str, n: int) -> bool:
    return len([r for r in await s.c.event_rows(job_id) if r["event"] == "started"]) >= n


async def _checkpoint_steps(s: Site, job_id: str) -> list[int]:
    return [_detail(r).get("step") for r in await s.c.event_rows(job_id) if r["event"] == "checkpointed"]


async def _checkpointed(s: Site, job_id: str, step: int) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        steps = await _checkpoint_steps(s, job_id)
        return await s.c.job(job_id) if any(x is not None and x >= step for x in steps) else None
    return await eventually(check, timeout=240, what=f"{job_id} checkpointed at step {step}")


async def _progress_end(s: Site, job_id: str, executor_id: str) -> dict[str, Any]:
    """The run's end as the job's abandoned event records it (outcome, last step). A later grant the leaving agent
    handed back unstarted (``handed_back``: the queue granted it again before the agent's leaving reached it) is
    not that run's end."""
    rows = [r for r in await s.c.event_rows(job_id) if r["event"] == "abandoned" and r["executor_id"] == executor_id
            and _detail(r).get("outcome") != "handed_back"]
    assert rows, [(r["event"], r["executor_id"]) for r in await s.c.event_rows(job_id)]
    return _detail(rows[-1])


async def _is(coro, value: str) -> bool:
    return await coro == value


async def _ready_job(s: Site, job_id: str) -> bool:
    return any(n["slurm_job_id"] == job_id for n in await s.ready_nodes())


async def _count(coro, n: int) -> bool:
    return len(await coro) >= n


def _cluster(slurm: SlurmCluster) -> str:
    return slurm_cli.cluster_name(slurm.env) or "slurm"
