"""``teto up --nats-cluster 3 --replicas 2`` in a subprocess, as the clustered rehearsal drives it
(tests/faults/test_cluster_rehearsal.py): SIGKILL any part by its name in processes.json (a NATS member is
``nats-node-<i>``, a service replica ``<service>-<i>``), watch the JetStream cluster from the outside as its
admin, and everything a fault round needs (tests/support/stackclient.py).

The workloads are the fault matrix's (tests/support/fault_workload.py): each run leaves its evidence in one
shared directory, so they run without per-run uids (``TETO_WORKLOAD_UID_RANGE`` empty), with this interpreter.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from nats.aio.client import Client

from libs.runtime import bus
from tests.e2e.stack import Stack, start_stack
from tests.support.faultstack import SERVICES, TIMINGS
from tests.support.fleet import kill_orphaned_workloads
from tests.support.services import eventually, eventually_blocking
from tests.support.stackclient import StackClient, Submitted

# The problems of GET /v1/status that are the bus's (services/gateway/domain/status.py nats_view).
NATS_PROBLEMS = ("nats member ", "stream ", "NATS: ")
MEMBERS = 3
REPLICAS = 2
EXECUTORS = 2  # 2 shared cores carry 3 servers, 10 service processes and the runs: keep the runs few


@dataclass(frozen=True)
class StreamView:
    """One stream's replication as JetStream reports it: its leader and, per member, whether it is current."""

    stream: str
    leader: str | None
    current: dict[str, bool]


def stream_view(info: Any) -> StreamView:
    """From a nats-py ``StreamInfo``: the leader is current by definition; an offline replica is not."""
    cluster = info.cluster
    if cluster is None:
        return StreamView(info.config.name, None, {})
    current = {cluster.leader: True} if cluster.leader else {}
    for peer in cluster.replicas or []:
        current[peer.name] = bool(peer.current) and not peer.offline
    return StreamView(info.config.name, cluster.leader, current)


def behind(views: list[StreamView], members: set[str], replicas: int) -> dict[str, list[str]]:
    """Per stream, what keeps it from full strength: no leader, or members not current. Empty when every stream
    has a leader and ``replicas`` current members, all of ``members``."""
    out: dict[str, list[str]] = {}
    for v in views:
        problems = [] if v.leader else ["no leader"]
        current = {m for m, ok in v.current.items() if ok}
        problems += sorted(f"{m} not current" for m in set(v.current) - current)
        if len(current) < replicas:
            problems.append(f"{len(current)} of {replicas} current")
        problems += sorted(f"{m} unknown" for m in current - members)
        if problems:
            out[v.stream] = problems
    return out


@dataclass
class ClusterWatch:
    """What the cluster showed after a member was killed: when its loss was seen and when every stream was
    back at full strength (seconds from the kill), the worst moment seen (the most problems at once), and
    whether any moment showed the member itself lost (named, a stream without a leader, or no answer)."""

    member: str
    lost_s: float | None = None
    restored_s: float | None = None
    worst: dict[str, list[str]] = field(default_factory=dict)
    showed_member: bool = False


@dataclass
class StatusWatch:
    """What ``teto status`` (``GET /v1/status``) showed after a member was killed: seconds from the kill until it
    first named the loss and until it no longer did, the problems it named then, and how its answers came."""

    member: str
    lost_s: float | None = None
    restored_s: float | None = None
    loss_problems: list[str] = field(default_factory=list)
    named: bool = False  # an answer during the loss named the member itself
    ok_s: float | None = None  # the first answer after the recovery with no problem at all (None: not in 30 s)
    answers: int = 0
    unanswered: int = 0  # no gateway answered 200
    slowest_s: float = 0.0  # the longest one request took


@dataclass
class ClusterStack(StackClient):
    root: Path
    stack: Stack | None = None
    accepted: list[Submitted] = field(default_factory=list)
    killed: dict[str, int] = field(default_factory=dict)  # part -> the pid the test killed
    first_pids: dict[str, int] = field(default_factory=dict)

    def start(self) -> None:
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.runs_dir, 0o777)
        env = {**TIMINGS, "TETO_WORKLOAD_UID_RANGE": ""}
        self.stack = start_stack(self.root / "teto", executors=EXECUTORS, extra_env=env, ready_timeout=240,
                                 args=("--nats-cluster", str(MEMBERS), "--replicas", str(REPLICAS)))
        try:
            eventually_blocking(self.all_ready, 240, "every service replica ready")
        except AssertionError as exc:  # which replicas, and why (a CI run shows nothing else of the stack)
            late = self.not_ready()
            raise AssertionError(f"{exc}: not ready: {late}; their logs end: "
                                 f"{ {name: self.log_of(name, 1500) for name in late} }; teto up's log ends: "
                                 f"{self.up_log()[-3000:]}") from None
        self.first_pids = {row["name"]: row["pid"] for row in self.processes()}

    def all_ready(self) -> bool:
        """Every replica of every service has said it is ready (teto/stack/run.py logs ``<service> ready``)."""
        return not self.not_ready()

    def up_log(self) -> str:
        """What ``teto up`` itself printed (tests/e2e/stack.py start_stack writes it beside the data directory)."""
        return "".join(path.read_text(errors="replace") for path in sorted(self.root.glob("up-*.log")))

    def not_ready(self) -> list[str]:
        return [f"{service}-{i}" for service in SERVICES for i in range(1, REPLICAS + 1)
                if f"teto.service: {service} ready" not in self.log_of(f"{service}-{i}", 10**8)]

    # -- what teto up wrote ------------------------------------------------------------------------------

    @property
    def info(self) -> dict[str, Any]:
        return json.loads((self.root / "teto" / "stack.json").read_text())

    @property
    def runs_dir(self) -> Path:
        return self.root / "runs"

    @property
    def token(self) -> str:
        return self.info["admin_token"]

    @property
    def gateway_urls(self) -> list[str]:
        return self.info["gateway_urls"]

    @property
    def database_url(self) -> str:
        return self.info["database_url"]

    @property
    def nats_url(self) -> str:
        return self.info["nats_url"]

    def nats_credentials(self) -> Path:
        return Path(self.info["nats_credentials_file"])

    def processes(self) -> list[dict[str, Any]]:
        return json.loads((self.root / "teto" / "processes.json").read_text())

    def pid(self, name: str) -> int:
        return next(row["pid"] for row in self.processes() if row["name"] == name)

    def log_of(self, name: str, tail: int = 3000) -> str:
        path = self.root / "teto" / "logs" / f"{name}.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def leader_lines(self, service: str) -> dict[str, int]:
        """How often each replica of ``service`` took a singleton loop's lock (libs/runtime/singleton.py)."""
        return {f"{service}-{i}": self.log_of(f"{service}-{i}", 10**8).count("this replica is the leader")
                for i in range(1, REPLICAS + 1)}

    def executor_ids(self) -> list[str]:
        return [row["executor_id"] for row in self.processes()
                if row["executor_id"] and row["pid"] and Path(f"/proc/{row['pid']}").exists()]

    def crashed(self) -> list[str]:
        """Parts teto up had to start again without the test killing them (or teto up itself gone)."""
        if self.stack is None or self.stack.proc.poll() is not None:
            return ["teto up"]
        return [row["name"] for row in self.processes() if row["name"] not in self.killed
                and row["pid"] != self.first_pids.get(row["name"], row["pid"])]

    # -- faults ------------------------------------------------------------------------------------------

    def kill(self, name: str) -> float:
        """SIGKILL one part's process group (teto up starts each in its own); returns time.monotonic()."""
        pid = self.pid(name)
        self.killed[name] = pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        return time.monotonic()

    async def replaced(self, name: str, timeout: float = 60) -> float:
        """Until teto up's supervisor runs ``name`` again in a new process (and, for a gateway, it answers);
        returns time.monotonic() then."""
        async def running_again() -> float | None:
            pid = self.pid(name)
            if pid != self.killed[name] and Path(f"/proc/{pid}").exists() and await self._answers(name):
                return time.monotonic()
            return None

        return await eventually(running_again, timeout, lambda: f"{name} running again: {self.log_of(name, 1500)}",
                                every=0.1)

    async def get_from(self, url: str, path: str) -> httpx.Response:
        """GET through one gateway replica only (no fallback to the other)."""
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            return await client.get(path, headers={"Authorization": f"Bearer {self.token}"})

    async def status(self) -> dict[str, Any] | None:
        """``GET /v1/status`` (what ``teto status`` prints) through whichever gateway answers; None: none did."""
        for url in self.gateway_urls:
            try:
                r = await self.get_from(url, "/v1/status")
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                return r.json()
        return None

    async def status_sees(self, named: str, killed_at: float, timeout: float = 120) -> StatusWatch:
        """From the kill, ``GET /v1/status`` every half second: when it first shows the loss (names ``named`` in
        its problems, or says a stream has no leader), then when it shows the recovery (after the loss was shown,
        an answer with no NATS problem at all: every member answering, every stream's info read, each with a
        leader and all replicas current), then when it is OK (no problem at all: the replicas that moved off the
        member answer again, their singletons held). Raises when the loss or the recovery is never shown."""
        seen = StatusWatch(named)
        while time.monotonic() - killed_at < timeout:
            asked = time.monotonic()
            st = await self.status()
            now = time.monotonic() - killed_at
            seen.answers += 1
            seen.slowest_s = max(seen.slowest_s, time.monotonic() - asked)
            if st is None:
                seen.unanswered += 1
            else:
                hits = [p for p in st["problems"] if named in p or "no leader" in p]
                seen.named = seen.named or any(named in p for p in hits)
                if hits and seen.lost_s is None:
                    seen.lost_s, seen.loss_problems = now, st["problems"]
                if seen.lost_s is not None and seen.restored_s is None and not any(
                        p.startswith(NATS_PROBLEMS) for p in st["problems"]):
                    seen.restored_s = now
                if seen.restored_s is not None and (st["ok"] or now - seen.restored_s > 30):
                    seen.ok_s = now if st["ok"] else None
                    return seen
            await asyncio.sleep(0.5)
        raise AssertionError(f"teto status did not show the loss and then the recovery of {named} within "
                             f"{timeout:.0f}s: {seen}")

    async def _answers(self, name: str) -> bool:
        if not name.startswith("gateway-"):
            return True
        url = self.gateway_urls[int(name.rsplit("-", 1)[1]) - 1]
        try:
            async with httpx.AsyncClient(timeout=2) as client:
                return (await client.get(f"{url}/healthz")).status_code == 200
        except httpx.HTTPError:
            return False

    # -- the JetStream cluster, seen by its admin --------------------------------------------------------

    async def views(self, js: Any) -> list[StreamView]:
        return [stream_view(info) for info in await js.streams_info()]

    async def stream_leader(self, stream: str) -> str:
        nc = await self.bus()
        try:
            return (await nc.jetstream(timeout=10).stream_info(stream)).cluster.leader
        finally:
            await nc.close()

    async def observer(self, avoid: str) -> Client:
        """The bus as its admin through a member other than ``avoid`` (the one about to be killed), connected
        before the kill so that watching starts with it."""
        urls = self.nats_url.split(",")
        keep = [u for i, u in enumerate(urls) if f"node-{i + 1}" != avoid]
        return await bus.connect(",".join(keep), "teto-test-observer", credentials_file=self.nats_credentials())

    async def watch(self, nc: Client, member: str, killed_at: float, timeout: float = 90) -> ClusterWatch:
        """From the kill, through ``nc`` (an observer, closed at the end): when some stream first shows the
        member's loss, then when every stream is back at full strength (a leader and all members current). A
        stream listing that does not answer (leaders being elected) counts as a loss."""
        seen = ClusterWatch(member)
        members = {f"node-{i}" for i in range(1, MEMBERS + 1)}
        try:
            js = nc.jetstream(timeout=2)
            while time.monotonic() - killed_at < timeout:
                try:
                    state = behind(await self.views(js), members, MEMBERS)
                except Exception as exc:  # noqa: BLE001 - no answer while the cluster re-forms
                    state = {"(all)": [f"no answer: {type(exc).__name__}"]}
                now = time.monotonic() - killed_at
                if state and seen.lost_s is None:
                    seen.lost_s = now
                if sum(map(len, state.values())) > sum(map(len, seen.worst.values())):
                    seen.worst = state
                seen.showed_member = seen.showed_member or any(
                    member in p or "no leader" in p or "no answer" in p for ps in state.values() for p in ps)
                if not state and seen.lost_s is not None:
                    seen.restored_s = now
                    return seen
                await asyncio.sleep(0.2)
        finally:
            await nc.close()
        raise AssertionError(f"the cluster did not return to full strength within {timeout:.0f}s: {seen}")

    def close(self) -> None:
        if self.stack is not None:
            with contextlib.suppress(Exception):
                self.stack.stop()
        kill_orphaned_workloads(self.runs_dir)
