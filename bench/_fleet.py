"""A simulated fleet for bench/bench_fleet.py: thousands of executors as asyncio tasks in one process, each
speaking the agent's protocol on the real subjects: registration (``NodeRegistered``), a heartbeat every interval,
and, while it holds a job, the lease renewal over request/reply, a step report and a usage report each interval.

Each executor starts at its place in the first interval, registers and heartbeats at once. Grants arrive as the queue sends them (``RunJob`` on the AGENT stream); the fleet reads them through one shared
pull consumer instead of one durable per executor (10,000 durables are the simulator's cost, not the control
plane's) and hands each to its executor, which confirms the lease (the agent's first renewal) and reports the
run started. A killed executor stops everything at once, as a machine that lost power would.

Probes: a fixed sample of executors note when each of their heartbeats was sent, for the signal evaluation lag.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from datetime import datetime

from nats.aio.client import Client
from nats.js import JetStreamContext

from libs.contracts.agents import RunJob
from libs.contracts.envelope import utcnow
from libs.contracts.leases import LeaseRenewReply, LeaseRenewRequest
from libs.contracts.nodes import NodeRegistered
from libs.contracts.subjects import Subjects
from libs.contracts.telemetry import Heartbeat, Phase, RunStarted, StepReport
from libs.contracts.usage import UsageRecord, UsageReport

GROUP = "fleet"


@dataclass
class Probe:
    executor_id: str
    sent_at: datetime  # the heartbeat's own send time, as health stores it
    sent: float  # time.time() when it was published
    ingested: float | None = None  # when health's table first showed it (polled)
    due: float | None = None  # time.time() when the schedule said to send it (``sent - due``: the simulator late)
    received: float | None = None  # when health's heartbeat handler began on its batch (health's batch log)
    streamed: float | None = None  # when JetStream stored it (health's batch log)


@dataclass
class SimExecutor:
    id: str
    probe: bool = False
    alive: bool = True
    job_id: str | None = None
    epoch: int | None = None
    step: int = 0
    usage_seq: int = 0
    job_started: float = 0.0
    registered: float | None = None  # time.time() of its registration, once sent
    last_beat: float | None = None  # time.time() of its last heartbeat sent
    beats: int = 0
    killed: float | None = None  # time.time() of the kill

    @property
    def node(self) -> str:
        return f"node-{self.id}"


@dataclass
class FleetCounters:
    heartbeats: int = 0
    renewals: int = 0
    renewals_refused: int = 0
    renewals_unanswered: int = 0
    grants: int = 0
    step_reports: int = 0
    usage_reports: int = 0
    send_errors: int = 0
    late_beats: int = 0  # heartbeats sent more than half an interval after they were due (the simulator lagging)
    unborn_killed: int = 0  # killed before their start came: never registered, never heard (a machine never on)


@dataclass
class Fleet:
    nc: Client
    js: JetStreamContext
    subjects: Subjects
    size: int
    interval: float
    probes: int = 200  # executors whose heartbeats are timed end to end
    executors: list[SimExecutor] = field(default_factory=list)
    counters: FleetCounters = field(default_factory=FleetCounters)
    probe_log: list[Probe] = field(default_factory=list)
    abandoned: set[str] = field(default_factory=set)  # jobs granted whose confirmation the executor gave up on
    dropped: set[str] = field(default_factory=set)  # jobs granted to an executor busy with another, ignored
    grant_delays: list[float] = field(default_factory=list)  # seconds from a grant's making to its reading here
    _tasks: list[asyncio.Task] = field(default_factory=list)

    _t0: float = 0.0  # time.monotonic() at start: executor i's k-th heartbeat is due at _t0 + offset_i + k interval

    def __post_init__(self) -> None:
        stride = max(1, self.size // max(1, self.probes))
        self.executors = [SimExecutor(f"sim{i:05d}", probe=i % stride == 0) for i in range(self.size)]
        self._by_id = {e.id: e for e in self.executors}

    async def start(self) -> None:
        """Executors starting spread evenly over the interval (registration, then heartbeats), and the grant
        reader."""
        self._tasks.append(asyncio.create_task(self._grants(), name="fleet-grants"))
        self._t0 = time.monotonic()
        for i, e in enumerate(self.executors):
            offset = self.interval * i / self.size
            self._tasks.append(asyncio.create_task(self._life(e, offset), name=f"sim-{e.id}"))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        # All at once, and cancellable itself (a bounded stop must be able to give up on it).
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def kill(self, ids: list[str]) -> None:
        now = time.time()
        for i in ids:
            self._by_id[i].alive, self._by_id[i].killed = False, now

    def by_id(self, executor_id: str) -> SimExecutor:
        return self._by_id[executor_id]

    def executor(self, executor_id: str) -> SimExecutor | None:
        return self._by_id.get(executor_id)

    @property
    def up(self) -> int:
        """Executors that have sent a heartbeat."""
        return sum(1 for e in self.executors if e.beats)

    @property
    def busy(self) -> int:
        return sum(1 for e in self.executors if e.alive and e.job_id)

    # -- one executor ---------------------------------------------------------------------------------------

    async def _life(self, e: SimExecutor, offset: float) -> None:
        """An agent's life: it starts (spread evenly over the first interval), registers its node and sends its
        first heartbeat at once, as the agent does; a registered node without a heartbeat is judged no_signal.
        Each heartbeat is due at its place in the schedule (start + offset + k intervals), whenever the event loop
        gets to it: ``Probe.due`` keeps that, so a simulator that falls behind shows as its own part of the lag.
        One killed before its start never comes up (no registration: the bench counts it apart)."""
        due = self._t0 + offset
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        if not e.alive:
            self.counters.unborn_killed += 1
            return
        if await self._send(self.subjects.node(e.node, "registered"), NodeRegistered(
                node_id=e.node, executor_id=e.id, group=GROUP, hostname=e.node, cpu_count=8, agent_version="sim",
                boot_id=f"boot-{e.id}")):
            e.registered = time.time()
        while e.alive:
            if time.monotonic() - due > self.interval / 2:
                self.counters.late_beats += 1
            await self._beat(e, time.time() - (time.monotonic() - due))
            if e.job_id and e.alive:
                await self._working(e)
            due += self.interval
            await asyncio.sleep(max(0.0, due - time.monotonic()))

    async def _beat(self, e: SimExecutor, due: float) -> None:
        sent_at, sent = utcnow(), time.time()
        beat = Heartbeat(executor_id=e.id, node_id=e.node, group=GROUP, accepting=e.job_id is None,
                         job_id=e.job_id, epoch=e.epoch, phase=Phase.TRAINING if e.job_id else Phase.IDLE,
                         step=e.step if e.job_id else None, sent_at=sent_at, interval_seconds=self.interval,
                         progress_interval_seconds=self.interval)
        if await self._send(self.subjects.heartbeat(e.id), beat):
            self.counters.heartbeats += 1
            e.beats, e.last_beat = e.beats + 1, sent
            if e.probe:
                self.probe_log.append(Probe(e.id, sent_at, sent, due=due))

    async def _working(self, e: SimExecutor) -> None:
        """What an agent does each interval while its job runs: renew, report the step, report usage."""
        reply = await self._renew(e)
        if reply is None or not e.alive:
            return
        if not reply.ok:  # the queue took the job back: idle again, as the agent would be after killing it
            self.counters.renewals_refused += 1
            e.job_id, e.epoch = None, None
            return
        e.step += 10
        if await self._send(self.subjects.progress(e.job_id, e.id), StepReport(
                job_id=e.job_id, epoch=e.epoch, executor_id=e.id, step=e.step, step_seconds=0.1)):
            self.counters.step_reports += 1
        e.usage_seq += 1
        now = time.monotonic()
        record = UsageRecord(job_id=e.job_id, epoch=e.epoch, seq=e.usage_seq, devices=1,
                             wall_seconds=now - e.job_started)
        e.job_started = now
        if await self._send(self.subjects.usage(e.id), UsageReport(executor_id=e.id, node_id=e.node,
                                                                  records=[record])):
            self.counters.usage_reports += 1

    async def _renew(self, e: SimExecutor) -> LeaseRenewReply | None:
        request = LeaseRenewRequest(job_id=e.job_id, epoch=e.epoch, executor_id=e.id)
        try:
            msg = await self.nc.request(self.subjects.rpc_lease_renew_of(e.id), request.encode(),
                                        timeout=self.interval)
            reply = LeaseRenewReply.decode(msg.data)
        except Exception:  # noqa: BLE001 - no answer in time: the agent would try again next interval
            self.counters.renewals_unanswered += 1
            return None
        self.counters.renewals += 1
        return reply

    async def _grants(self) -> None:
        sub = await self.js.pull_subscribe(self.subjects.agent_all, durable="bench-fleet-agents",
                                           stream=self.subjects.stream_name("AGENT"))
        while True:
            try:
                msgs = await sub.fetch(100, timeout=0.5)
            except asyncio.TimeoutError:
                continue
            for m in msgs:
                with contextlib.suppress(Exception):
                    await m.ack()
                if m.subject.rsplit(".", 1)[-1] == "run":  # checks and stops are not simulated
                    grant = RunJob.decode(m.data)
                    self.grant_delays.append(time.time() - grant.time.timestamp())
                    e = self._by_id.get(grant.executor_id)
                    if e is not None and e.alive and e.job_id is None:
                        asyncio.create_task(self._take(e, grant))
                    elif e is not None and e.alive:
                        # Granted while it runs another (the queue placed on an older "accepting" heartbeat): not
                        # simulated (an agent would refuse it), so no heartbeat will ever name this job.
                        self.dropped.add(grant.job_id)

    async def _take(self, e: SimExecutor, grant: RunJob) -> None:
        e.job_id, e.epoch, e.step, e.usage_seq, e.job_started = grant.job_id, grant.epoch, 0, 0, time.monotonic()
        reply = await self._renew(e)  # the agent confirms the grant before starting
        if reply is None or not reply.ok:
            # Given up without an answer (the queue too slow to confirm): no heartbeat will name the job, which
            # the queue holds as granted until its lease ends, so health rightly judges it no_signal.
            self.abandoned.add(grant.job_id)
            e.job_id, e.epoch = None, None
            return
        self.counters.grants += 1
        await self._send(self.subjects.progress(grant.job_id, e.id), RunStarted(
            job_id=grant.job_id, epoch=grant.epoch, executor_id=e.id, device="cpu"))

    async def _send(self, subject: str, msg) -> bool:
        try:
            await self.js.publish(subject, msg.encode(), timeout=max(2.0, self.interval))
            return True
        except Exception:  # noqa: BLE001 - counted: a lost heartbeat is what the bench is there to notice
            self.counters.send_errors += 1
            return False
