"""A small Teto for the fault tests: the queue, health and gateway services in this process (their ``serve()``
as tasks) and executor agents as real subprocesses, each of which can reach NATS directly or through a proxy.

The test drives it the way an operator does (HTTP through the gateway) and reads the evidence the fault
workload leaves (tests/support/fault_workload.py). Timings are the short ones of the test environment:
lease 6 s, heartbeat 1 s, stop margin 1.5 s, lease scan every 0.5 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from libs.runtime.ports import free_port_block
from services.gateway.auth import create_token
from services.gateway.settings import GatewaySettings
from services.health.settings import HealthSettings
from services.queue.settings import QueueSettings
from tests.support.services import eventually, running

WORKLOAD = str(Path(__file__).with_name("fault_workload.py"))
TERMINAL = {"succeeded", "failed", "cancelled"}




def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with contextlib.suppress(OSError):  # dead but not yet reaped by its parent counts as gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    return False


async def death_of(pid: int, timeout: float) -> float:
    """Wall time (time.time()) at which ``pid`` was first seen gone, polled every 20 ms."""
    await eventually(lambda: process_gone(pid), timeout, f"process {pid} to end", every=0.02)
    return time.time()


def at(value: str) -> float:
    """An API timestamp as epoch seconds, comparable with time.time()."""
    return datetime.fromisoformat(value).timestamp()







@dataclass
class Fleet:
    env: Any  # tests.conftest.TestEnv
    root: Path
    nats_url: str
    http: httpx.AsyncClient
    db: asyncpg.Connection
    queue_settings: QueueSettings
    health_settings: HealthSettings
    executors: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    # -- executors ---------------------------------------------------------------------------------------

    def start_executor(self, executor_id: str, *, nats_url: str | None = None, **extra: str) -> subprocess.Popen:
        env = self.env.env_vars(TETO_NATS_URL=nats_url or self.nats_url, TETO_PROGRESS_INTERVAL_SECONDS="0.5",
                                TETO_STOP_GRACE_SECONDS="2", TETO_NODE_ID=f"node-{executor_id}", **extra)
        log = open(self.root / f"{executor_id}.log", "ab")  # noqa: SIM115 - handed to the process
        proc = subprocess.Popen([sys.executable, "-m", "teto.cli", "executor", "--executor-id", executor_id,
                                 "--group", "faults"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        log.close()
        self.executors[executor_id] = proc
        return proc

    async def wait_executors(self, *ids: str, timeout: float = 60) -> None:
        """Until the queue has a fresh, accepting heartbeat from each (placement needs it)."""
        async def seen() -> bool:
            rows = await self.db.fetch("SELECT executor_id FROM queue.executors WHERE accepting"
                                       " AND last_seen > now() - interval '3 seconds'")
            return set(ids) <= {r["executor_id"] for r in rows}
        await eventually(seen, timeout, f"executors {ids} to heartbeat")

    def log_of(self, executor_id: str) -> str:
        return (self.root / f"{executor_id}.log").read_text(errors="replace")

    # -- jobs through the gateway ------------------------------------------------------------------------

    def spec(self, name: str, *, steps: int = 20, step_seconds: float = 0.1, every: int = 5, max_attempts: int = 3,
             **env: str) -> dict[str, Any]:
        wl_env = {"RUNS_DIR": str(self.runs_dir), "STEPS": str(steps), "STEP_SECONDS": str(step_seconds), **env}
        return {"name": name, "workload": {"kind": "command", "command": [sys.executable, WORKLOAD], "env": wl_env},
                "checkpoint_every_steps": every, "max_attempts": max_attempts}

    async def submit(self, spec: dict[str, Any]) -> str:
        r = await self.http.post("/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    async def job(self, job_id: str) -> dict[str, Any]:
        r = await self.http.get(f"/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    async def events(self, job_id: str) -> list[dict[str, Any]]:
        r = await self.http.get(f"/v1/jobs/{job_id}/events")
        assert r.status_code == 200, r.text
        return r.json()

    async def executor_entries(self) -> dict[str, dict[str, Any]]:
        r = await self.http.get("/v1/executors")
        assert r.status_code == 200, r.text
        return {e["executor_id"]: e for e in r.json()}

    async def wait_job(self, job_id: str, check: Callable[[dict[str, Any]], Any], timeout: float, what: str
                       ) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            job = await self.job(job_id)
            return job if check(job) else None
        return await eventually(probe, timeout, f"job {job_id}: {what}")

    async def wait_done(self, job_id: str, timeout: float = 90) -> dict[str, Any]:
        return await self.wait_job(job_id, lambda j: j["state"] in TERMINAL, timeout, "a terminal state")

    def runs(self, job_id: str) -> list[dict[str, Any]]:
        return read_runs(self.runs_dir, job_id)

    def started(self, job_id: str) -> list[dict[str, Any]]:
        return [r for r in self.runs(job_id) if r["event"] == "start"]

    def last_checkpoints(self, job_id: str, epoch: int) -> set[int]:
        """The steps the last checkpoint of a run may have: the last one it confirmed, and the one it began
        to save after it, if any (a process killed between the atomic write and its note leaves only the
        ``saving`` line, and the checkpoint is on disk)."""
        runs = [r for r in self.runs(job_id) if r["epoch"] == epoch]
        confirmed = max((r["step"] for r in runs if r["event"] == "checkpoint"), default=0)
        begun = max((r["step"] for r in runs if r["event"] == "saving"), default=0)
        return {confirmed, begun}

    # -- teardown ----------------------------------------------------------------------------------------

    def stop_executors(self) -> None:
        stop_processes(self.executors.values())
        kill_orphaned_workloads(self.runs_dir)


def read_runs(runs_dir: Path, job_id: str) -> list[dict[str, Any]]:
    """The fault workload's evidence for a job (start, checkpoint, stop, end, overlap lines)."""
    path = runs_dir / f"{job_id}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def stop_processes(procs: Iterable[subprocess.Popen]) -> None:
    """SIGTERM each process group still alive, then SIGKILL what has not exited after 15 s."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def kill_orphaned_workloads(runs_dir: Path) -> None:
    """A workload left behind by a killed agent or a hanging test must not outlive the test (its pid is in the
    run records the fault workload writes)."""
    for path in runs_dir.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError, KeyError, ProcessLookupError, PermissionError):
                pid = json.loads(line)["pid"]
                if not process_gone(pid):
                    os.kill(pid, signal.SIGKILL)


@contextlib.asynccontextmanager
async def fleet(env: Any, root: Path, *, nats_url: str | None = None, stuck_after: float = 120.0,
                queue_overrides: dict[str, Any] | None = None) -> AsyncIterator[Fleet]:
    """Queue, health and gateway in this process; executors are added by the test (``start_executor``)."""
    from services.gateway.app import serve as gateway_serve
    from services.health.app import serve as health_serve
    from services.queue.app import serve as queue_serve

    nats_url = nats_url or env.infra.nats_url
    root.mkdir(parents=True, exist_ok=True)
    # Deep node checks (DESIGN.md 7) are not what these tests are about, and on 2 cores a check run costs each new
    # executor ~10 s of CPU: nodes stay 'joining' (no check run starts) and placement does not wait for them.
    qs = env.settings(QueueSettings, nats_url=nats_url, schedule_interval_seconds=0.2, scan_interval_seconds=0.5,
                      stop_grace_seconds=2.0, require_checked_nodes=False, **(queue_overrides or {}))
    hs = env.settings(HealthSettings, nats_url=nats_url, evaluate_interval_seconds=0.25,
                      stuck_after_seconds=stuck_after, join_batch_seconds=3600)
    tokens = root / "tokens.json"
    token = create_token(tokens, "fault-tester", "admin")
    gs = env.settings(GatewaySettings, nats_url=nats_url, http_port=free_port_block(1), tokens_file=tokens)
    db = await asyncpg.connect(env.database_url)
    async with running(queue_serve, qs), running(health_serve, hs), running(gateway_serve, gs), \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{gs.http_port}", timeout=30,
                              headers={"Authorization": f"Bearer {token}"}) as http:
        f = Fleet(env=env, root=root, nats_url=nats_url, http=http, db=db, queue_settings=qs, health_settings=hs)
        try:
            yield f
        finally:
            await asyncio.to_thread(f.stop_executors)
            await db.close()
