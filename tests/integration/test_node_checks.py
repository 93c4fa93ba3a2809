"""Deep checks end to end with real NATS and PostgreSQL, the real queue and health services and real executor
agents (in this process; their check suites run as child processes, CPU sizes).

One story, in order: a node passes and runs a job; three nodes join while it runs; none of them gets work
before passing, and the job is never interrupted; one of them fails (test switch), is rebooted, fails again
and is replaced through the provisioner hook; the replacement passes and takes work; an on-demand run of the
group shows per-node progress to completion, and the busy node is checked only after its job ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from datetime import datetime
from pathlib import Path

import pytest

from agents.executor.main import serve as agent_serve
from agents.executor.checks.handler import Reboot
from agents.executor.settings import ExecutorSettings
from libs.contracts.commands import RunHealthCheck, SubmitJob
from libs.contracts.jobs import CommandWorkload, JobSpec
from libs.contracts.nodes import NodeEvent
from services.health.app import serve as health_serve
from services.health.settings import HealthSettings
from services.queue.settings import QueueSettings

from tests.integration.helpers_hba import collect
from tests.integration.helpers_queue import client, queue_service
from tests.support.services import eventually, running

pytestmark = pytest.mark.integration
GROUP = "g"


class Agents:
    """Executor agents run as tasks; a reboot directive restarts one in place (same ids, a new boot)."""

    def __init__(self, env) -> None:
        self.env = env
        self.tasks: dict[str, asyncio.Task] = {}
        self.reboots: dict[str, int] = {}

    def start(self, name: str, **overrides) -> None:
        settings = self.env.settings(ExecutorSettings, executor_id=f"ex-{name}", node_id=f"node-{name}",
                                     group=GROUP, progress_interval_seconds=0.5, check_timeout_seconds=120,
                                     torch_threads=1, advertise_host="127.0.0.1", **overrides)

        async def loop() -> None:
            while True:
                try:
                    await agent_serve(settings)
                    return
                except Reboot:
                    self.reboots[name] = self.reboots.get(name, 0) + 1

        self.tasks[name] = asyncio.create_task(loop(), name=name)

    async def stop_one(self, name: str) -> None:
        """The agent stops without a word (a restarted stack, a machine powered off)."""
        task = self.tasks.pop(name)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task

    async def stop(self) -> None:
        for t in self.tasks.values():
            t.cancel()
        for t in self.tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


def waits_for(path: Path) -> CommandWorkload:
    """A job that runs until the test creates ``path`` (so the test decides when it ends)."""
    code = f"import os, time\nwhile not os.path.exists({str(path)!r}): time.sleep(0.2)"
    return CommandWorkload(command=[sys.executable, "-c", code])


def node_events(col) -> list[NodeEvent]:
    out = []
    for m in col.msgs:
        if b'"teto.node.event/1"' in m.data:
            out.append(NodeEvent.decode(m.data))
    return out


def first(events: list[NodeEvent], node: str, kind: str) -> datetime | None:
    times = [e.time for e in events if e.node_id == node and e.event == kind]
    return min(times) if times else None


async def test_nodes_prove_themselves_recover_are_replaced_and_are_checked_on_demand(env, tmp_path):
    provision_dir = tmp_path / "provision"
    provision_dir.mkdir()
    hook = (f"{sys.executable} -c \"import pathlib,sys; pathlib.Path(sys.argv[1]).write_text(sys.argv[2])\" "
            f"{provision_dir}/{{node_id}} {{group}}")
    hs = env.settings(HealthSettings, join_batch_seconds=1.5, check_interval_seconds=0.3, max_reboots=1,
                      min_ratio=0.05,  # 2 shared cores: relative verdicts are unit-tested, not timed here
                      provisioner_command=hook, evaluate_interval_seconds=0.5)
    qs = env.settings(QueueSettings, schedule_interval_seconds=0.2)
    agents = Agents(env)
    release = {name: tmp_path / f"release-{name}" for name in ("j1", "j2", "j3", "j4")}

    async with running(health_serve, hs), queue_service(qs), client(qs) as c, \
            collect(hs.nats_url, hs.subjects.node_all) as col:
        async def node(name: str) -> dict | None:
            row = await c.db.fetchrow("SELECT * FROM health.nodes_public WHERE node_id = $1", f"node-{name}")
            return dict(row) if row else None

        async def state_is(name: str, state: str) -> bool:
            row = await node(name)
            return bool(row and row["state"] == state)

        async def job(job_id: str) -> dict:
            return await c.job(job_id)

        try:
            # 1. The first node proves itself and takes a job.
            agents.start("busy")
            await eventually(lambda: state_is("busy", "ready"), timeout=60)
            assert (await c.command(SubmitJob(actor="t", job_id="j1",
                                              spec=JobSpec(workload=waits_for(release["j1"]))))).accepted
            await c.wait_state("j1", "running", timeout=20)
            assert (await job("j1"))["executor_id"] == "ex-busy"

            # 2. Three nodes join while it runs; two more jobs wait for them. ex-bad fails its matmul.
            for name in ("a", "b"):
                agents.start(name)
            agents.start("bad", test_fault="matmul:fail")
            for j in ("j2", "j3"):
                assert (await c.command(SubmitJob(actor="t", job_id=j,
                                                  spec=JobSpec(workload=waits_for(release[j]))))).accepted
            await c.wait_state("j2", "running", timeout=90)
            await c.wait_state("j3", "running", timeout=30)

            # 3. The faulty node: failed, rebooted, failed again, replaced, and the provisioner was asked.
            await eventually(lambda: state_is("bad", "replaced"), timeout=150)
            assert agents.reboots.get("bad") == 1
            await eventually(lambda: asyncio.sleep(0, first(node_events(col), "node-bad", "replaced")), timeout=10)
            events = node_events(col)
            bad = [e.event.value for e in events if e.node_id == "node-bad"]
            assert bad == ["joining", "checking", "failed", "recovering", "joining", "checking", "failed",
                           "replaced"], bad
            # Each event names the agent start it is about: the reboot came back as a new one (placement trusts a
            # "ready" only for the heartbeats of its start: scans.SCHEDULABLE_NODE).
            boots = [e.boot_id for e in events if e.node_id == "node-bad"]
            assert None not in boots and len({*boots[:4]}) == 1 and len({*boots[4:]}) == 1 and boots[0] != boots[4], boots
            failed = next(e for e in events if e.node_id == "node-bad" and e.event == "failed")
            assert "matmul" in (failed.reason or "") and not failed.schedulable
            await eventually(lambda: asyncio.sleep(0, (provision_dir / "node-bad").exists()), timeout=20)
            assert (provision_dir / "node-bad").read_text() == GROUP
            # The matmul failure was re-run once before it counted, each time.
            results = await c.db.fetch("SELECT attempt, status FROM health.check_results WHERE node_id = 'node-bad'"
                                       " AND test = 'matmul'")
            assert [(r["attempt"], r["status"]) for r in results] == [(2, "failed"), (2, "failed")]

            # 4. The replacement joins, passes and takes work.
            agents.start("new")
            assert (await c.command(SubmitJob(actor="t", job_id="j4",
                                              spec=JobSpec(workload=waits_for(release["j4"]))))).accepted
            await c.wait_state("j4", "running", timeout=90)
            assert (await job("j4"))["executor_id"] == "ex-new"

            # No node got work before it was ready; the faulty one never got any; j1 was never interrupted.
            events = node_events(col)
            for j in ("j2", "j3", "j4"):
                lease = await c.db.fetchrow("SELECT time, executor_id FROM queue.job_events_public WHERE job_id = $1"
                                            " AND event = 'leased'", j)
                ready = first(events, lease["executor_id"].replace("ex-", "node-"), "ready")
                assert ready is not None and ready <= lease["time"], (j, lease, ready)
            assert not await c.db.fetchval("SELECT count(*) FROM queue.jobs WHERE 'ex-bad' = ANY(workers)")
            j1_events = [r["event"] for r in await c.event_rows("j1")]
            assert j1_events == ["submitted", "leased", "started"], j1_events

            # 5. On demand: every node of the group is busy, so all are cordoned and wait for their jobs.
            await eventually(lambda: c.db.fetchval(  # the health service has seen every job in heartbeats
                "SELECT count(*) = 4 FROM health.executors WHERE job_id IS NOT NULL"), timeout=10)
            out = await c.command(RunHealthCheck(actor="ops", group=GROUP, run_id="od1"), timeout=20)
            assert out.accepted and sorted(out.detail["cordoned"]) == ["node-a", "node-b", "node-busy", "node-new"]
            assert out.detail["skipped"] == {"node-bad": "replaced"}
            row = await c.db.fetchrow("SELECT * FROM health.check_runs_public WHERE run_id = 'od1'")
            assert {n["status"] for n in _nodes(row)} == {"waiting"}
            assert not (await node("busy"))["schedulable"] and "cordoned" in (await node("busy"))["reason"]
            await asyncio.sleep(1.0)
            assert {n["status"] for n in _nodes(await _run(c))} == {"waiting"}  # nothing checked while busy
            release["j1"].touch()
            await c.wait_state("j1", "succeeded", timeout=20)
            finished_at = (await c.db.fetchrow("SELECT time FROM queue.job_events_public WHERE job_id = 'j1' AND"
                                               " event = 'succeeded'"))["time"]
            seen: set[tuple[str, str]] = set()

            async def busy_node_done() -> bool:
                for n in _nodes(await _run(c)):
                    seen.update((n["node_id"], t["status"]) for t in n["tests"])
                    if n["node_id"] == "node-busy" and n["status"] == "passed":
                        return True
                return False

            await eventually(busy_node_done, timeout=60, every=0.1)
            assert ("node-busy", "running") in seen or ("node-busy", "passed") in seen
            checking = [e for e in node_events(col) if e.node_id == "node-busy" and e.event == "checking"
                        and e.run_id == "od1"]
            assert checking and checking[0].time >= finished_at  # checked only after its job ended
            for j in ("j2", "j3", "j4"):
                release[j].touch()
            await eventually(lambda: _run_done(c), timeout=90)
            run = await _run(c)
            assert {n["node_id"]: n["status"] for n in _nodes(run)} == {
                "node-a": "passed", "node-b": "passed", "node-busy": "passed", "node-new": "passed"}
            for n in _nodes(run):
                tests = {t["test"]: t for t in n["tests"]}
                assert tests["matmul"]["figures"]["tflops_float32"] > 0
                assert tests["membw"]["figures"]["copy_gbps"] > 0
                assert tests["nvml"]["status"] == "not_applicable"  # CPU node: said, not a silent pass
            assert [await state_is(n, "ready") for n in ("a", "b", "busy", "new")] == [True] * 4
        finally:
            for p in release.values():
                p.touch()
            await agents.stop()


def _nodes(row) -> list[dict]:
    import json

    value = row["nodes"]
    return json.loads(value) if isinstance(value, str) else value


async def _run(c):
    return await c.db.fetchrow("SELECT * FROM health.check_runs_public WHERE run_id = 'od1'")


async def _run_done(c) -> bool:
    row = await _run(c)
    return row["state"] == "done"
