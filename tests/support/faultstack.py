"""The whole of Teto as separate processes, two replicas of each service, for the fault matrix (tests/faults).

Unlike ``teto up`` (tests/e2e/stack.py) this stack owns its NATS and PostgreSQL servers, so a test can restart
them, and starts every part itself, so a test can SIGKILL one replica and knows exactly which. Executors may
reach NATS through a severable TCP proxy (tests/support/proxy.py). Jobs are ``command`` workloads running
tests/support/fault_workload.py, which leaves per-run evidence (start, checkpoint, overlap) in ``runs_dir``.

Timings are the short ones of the test environment: lease 6 s, heartbeat 1 s, stop margin 1.5 s, lease scan
every 0.5 s. Deep node checks are off (nodes stay ``joining`` and placement does not wait for a verdict): on
2 shared cores a check run costs each executor ~10 s of CPU and is not what these faults are about.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from libs.runtime.ports import free_port_block
from services.gateway.auth import create_token
from teto.stack.embedded import EmbeddedNats, EmbeddedPostgres
from tests.support.fleet import kill_orphaned_workloads, stop_processes
from tests.support.proxy import TcpProxy
from tests.support.stackclient import StackClient, Submitted
from tests.support.services import eventually

SERVICES = ("audit", "budget", "health", "queue", "gateway")  # consumers of commands first, gateway last
PREFIX = "teto"
TIMINGS = {"TETO_LEASE_SECONDS": "6", "TETO_HEARTBEAT_SECONDS": "1", "TETO_STOP_MARGIN_SECONDS": "1.5",
           "TETO_SCAN_INTERVAL_SECONDS": "0.5", "TETO_SCHEDULE_INTERVAL_SECONDS": "0.2",
           "TETO_REQUIRE_CHECKED_NODES": "false", "TETO_EVALUATE_INTERVAL_SECONDS": "0.25",
           "TETO_JOIN_BATCH_SECONDS": "3600", "TETO_STUCK_AFTER_SECONDS": "120", "TETO_STOP_GRACE_SECONDS": "2",
           "TETO_PROGRESS_INTERVAL_SECONDS": "0.5"}


@dataclass
class FaultStack(StackClient):
    root: Path
    replicas: int = 2
    nats: EmbeddedNats = field(init=False)
    pg: EmbeddedPostgres = field(init=False)
    token: str = ""
    gateway_ports: list[int] = field(default_factory=list)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)  # "queue-1", "executor:ex-a", ...
    proxies: dict[str, TcpProxy] = field(default_factory=dict)  # executor id -> its proxy
    accepted: list[Submitted] = field(default_factory=list)
    killed: set[str] = field(default_factory=set)  # parts a test killed on purpose (not crashes)
    log_starts: dict[str, int] = field(default_factory=dict)  # where each part's current run begins in its log

    def __post_init__(self) -> None:
        self.nats = EmbeddedNats(self.root / "nats")
        self.pg = EmbeddedPostgres(self.root / "pg")

    # -- paths and settings -------------------------------------------------------------------------------

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def database_url(self) -> str:
        return self.pg.url

    @property
    def nats_url(self) -> str:
        return self.nats.url

    @property
    def gateway_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.gateway_ports]

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TETO_")}
        env.update(TIMINGS)
        env.update(TETO_NATS_URL=self.nats.url, TETO_DATABASE_URL=self.database_url, TETO_SUBJECT_PREFIX=PREFIX,
                   TETO_DATA_DIR=str(self.root / "data"), TETO_TOKENS_FILE=str(self.root / "tokens.json"),
                   PYTHONUNBUFFERED="1")
        env.update(extra)
        return env

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = self.logs / f"{name}.log"
        self.log_starts[name] = log.stat().st_size if log.exists() else 0
        with open(self.logs / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                    cwd=Path(__file__).resolve().parents[2])
        self.procs[name] = proc
        return proc

    def log_of(self, name: str, tail: int = 3000) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def leader(self, service: str) -> str:
        """The replica leading most of the service's singleton loops (the harder one to lose); else the first."""
        def led(name: str) -> int:
            path = self.logs / f"{name}.log"
            with open(path, "rb") as f:
                f.seek(self.log_starts.get(name, 0))
                return f.read().decode(errors="replace").count("this replica is the leader")
        return max((f"{service}-{i}" for i in range(1, self.replicas + 1)), key=lambda n: (led(n), n[-1] == "1"))

    # -- start and stop -----------------------------------------------------------------------------------

    async def start(self, executors: tuple[str, ...] = ("ex-a", "ex-b"), proxied: tuple[str, ...] = ()) -> None:
        from teto.stack.up import _prepare_schema

        self.nats.start()
        self.pg.start()
        # Migrations and streams once, before any replica: replicas then start in parallel without racing.
        await asyncio.to_thread(_prepare_schema, self.nats.url, self.database_url, PREFIX)
        self.token = create_token(self.root / "tokens.json", "fault-tester", "admin")
        self.gateway_ports = [free_port_block(1) for _ in range(self.replicas)]
        for name in SERVICES:
            for i in range(1, self.replicas + 1):
                self.start_replica(name, i)
        await self.wait_replicas()
        for ex in executors:
            self.start_executor(ex, proxied=ex in proxied)
        await self.wait_executors(*executors)

    def start_replica(self, service: str, i: int) -> subprocess.Popen:
        name = f"{service}-{i}"
        self.killed.discard(name)
        ready = self.root / f"{name}.ready"
        ready.unlink(missing_ok=True)
        extra = {"TETO_READY_FILE": str(ready)}
        if service == "gateway":
            extra["TETO_HTTP_PORT"] = str(self.gateway_ports[i - 1])
        return self._spawn(name, [sys.executable, "-m", "tests.support.replica", service], self.env(**extra))

    async def wait_replicas(self, timeout: float = 120) -> None:
        def ready() -> bool:
            for service in SERVICES:
                for i in range(1, self.replicas + 1):
                    name = f"{service}-{i}"
                    if self.procs[name].poll() is not None:
                        raise AssertionError(f"{name} exited with {self.procs[name].returncode}:\n"
                                             f"{self.log_of(name)}")
                    if not (self.root / f"{name}.ready").exists():
                        return False
            return True
        await eventually(ready, timeout, "every service replica ready", every=0.2)

    def kill(self, name: str, *, group: bool = True) -> float:
        """SIGKILL a part (with ``group``, its whole process group); returns the wall time."""
        proc = self.procs[name]
        self.killed.add(name)
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        return time.time()

    def start_executor(self, executor_id: str, *, proxied: bool = False) -> subprocess.Popen:
        url = self.nats.url
        if proxied:
            proxy = self.proxies.get(executor_id) or TcpProxy.to_url(self.nats.url).start()
            self.proxies[executor_id] = proxy
            url = proxy.url
        env = self.env(TETO_NATS_URL=url, TETO_NODE_ID=f"node-{executor_id}")
        return self._spawn(f"executor:{executor_id}", [sys.executable, "-m", "teto.cli", "executor",
                                                        "--executor-id", executor_id, "--group", "faults"], env)

    async def wait_executors(self, *ids: str, timeout: float = 90) -> None:
        """Until the queue has a fresh, accepting heartbeat from each (placement needs it)."""
        async def seen() -> bool:
            rows = await self.sql("SELECT executor_id FROM queue.executors WHERE accepting"
                                  " AND last_seen > now() - interval '3 seconds'")
            return set(ids) <= {r["executor_id"] for r in rows}
        await eventually(seen, timeout, f"executors {ids} to heartbeat", every=0.2)

    def crashed(self) -> list[str]:
        """Parts that exited without the test killing them."""
        return [n for n, p in self.procs.items() if p.poll() is not None and n not in self.killed]

    def executor_ids(self) -> list[str]:
        return [n.split(":", 1)[1] for n, p in self.procs.items() if n.startswith("executor:") and p.poll() is None]

    def close(self) -> None:
        stop_processes(self.procs.values())
        kill_orphaned_workloads(self.runs_dir)  # a workload orphaned by a killed agent must not outlive us
        for proxy in self.proxies.values():
            proxy.close()
        self.pg.stop(destroy=True)
        self.nats.stop()


def stack_root() -> Path:
    """A directory the PostgreSQL service user can enter (mkdtemp makes 0700), short enough for its socket."""
    root = Path(tempfile.mkdtemp(prefix="teto-faults-"))
    os.chmod(root, 0o755)
    return root


def remove_root(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
