"""Helpers for the queue service's integration tests: run ``serve()`` as a task, wait on conditions, send
commands and wait for their outcome, read the public views, and play an executor agent with plain nats-py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import nats
from nats.aio.client import Client
from nats.js import JetStreamContext

from libs.contracts.agents import RunJob, StopJob
from libs.contracts.commands import Command, CommandOutcome
from libs.contracts.envelope import Envelope, utcnow
from libs.contracts.leases import LeaseRenewReply, LeaseRenewRequest
from libs.contracts.nodes import NodeEvent
from libs.contracts.telemetry import Heartbeat, Phase, RunFinished, RunOutcome
from libs.runtime import bus
from libs.runtime.tasks import stop_tasks
from services.queue.app import serve
from services.queue.settings import QueueSettings
from tests.support.services import eventually, running


def queue_service(settings: QueueSettings):
    """The queue service running in this event loop until the block ends."""
    return running(serve, settings)


class Client_:
    """A test's own NATS and PostgreSQL connections: commands, outcomes, views, job events."""

    def __init__(self, settings: QueueSettings, nc: Client, js: JetStreamContext, db: asyncpg.Connection) -> None:
        self.settings = settings
        self.s = settings.subjects
        self.nc = nc
        self.js = js
        self.db = db

    async def command(self, cmd: Command, *, timeout: float = 10.0) -> CommandOutcome:
        """Publish a command the way the gateway does (listen for the outcome first) and await the outcome."""
        sub = await self.nc.subscribe(self.s.outcome_of(cmd.command_id))
        try:
            await bus.publish(self.js, self.s.cmd(cmd.KIND), cmd)
            msg = await sub.next_msg(timeout=timeout)
            return CommandOutcome.decode(msg.data)
        finally:
            await sub.unsubscribe()

    async def job(self, job_id: str) -> dict[str, Any] | None:
        row = await self.db.fetchrow("SELECT * FROM queue.jobs_public WHERE id = $1", job_id)
        if row is None:
            return None
        out = dict(row)
        for k in ("spec", "attempts", "last_checkpoint", "ceiling_history", "waiting"):
            if k in out:
                out[k] = None if out[k] is None else json.loads(out[k])
        return out

    async def state(self, job_id: str) -> str | None:
        return await self.db.fetchval("SELECT state FROM queue.jobs_public WHERE id = $1", job_id)

    async def wait_state(self, job_id: str, state: str, timeout: float = 10.0) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            job = await self.job(job_id)
            return job if job and job["state"] == state else None
        return await eventually(check, timeout)

    async def event_rows(self, job_id: str) -> list[asyncpg.Record]:
        return await self.db.fetch("SELECT * FROM queue.job_events_public WHERE job_id = $1 ORDER BY seq", job_id)

    async def published_events(self, job_id: str, expect: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        """The job's events as published on the JOB stream (through the outbox), in stream order."""
        sub = await self.js.pull_subscribe(self.s.job_events_of(job_id), durable=None)
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(got) < expect and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):  # nats' own and asyncio's plain one
                for m in await sub.fetch(expect - len(got), timeout=0.5):
                    got.append(json.loads(m.data))
                    await m.ack()
        await sub.unsubscribe()
        return got


@contextlib.asynccontextmanager
async def client(settings: QueueSettings) -> AsyncIterator[Client_]:
    nc = await nats.connect(settings.nats_url)
    db = await asyncpg.connect(settings.database_url)
    try:
        yield Client_(settings, nc, nc.jetstream(), db)
    finally:
        await db.close()
        await nc.close()  # not drain: a pull subscription cut mid-fetch would hold a drain for its full timeout


class FakeExecutor:
    """Plays an executor agent: heartbeats (idle or busy), receives its directives from the AGENT stream, renews
    its lease over the RPC, and reports progress. The test decides what the 'training process' does."""

    def __init__(self, c: Client_, executor_id: str, gpus: int = 0, group: str = "default") -> None:
        self.c = c
        self.id = executor_id
        self.group = group  # a gang's workers are all of one node group
        self.gpus = gpus
        self.job_id: str | None = None
        self.epoch: int | None = None
        self.beating = True
        self.boot_id: str | None = None  # this start's (NodeRegistered.boot_id), in its heartbeats when set
        self._tasks: list[asyncio.Task] = []
        self.directives: asyncio.Queue[Envelope] = asyncio.Queue()

    async def start(self) -> FakeExecutor:
        s = self.c.s
        sub = await self.c.js.pull_subscribe(s.agent_all_of(self.id), durable=f"agent-{self.id}",
                                             stream=s.stream_name("AGENT"))
        self._tasks = [asyncio.create_task(self._heartbeat()), asyncio.create_task(self._listen(sub))]
        await self.node_ready()
        return self

    async def node_ready(self, schedulable: bool = True, seq: int = 1, boot_id: str | None = None) -> None:
        """Play the health service: this executor's node passed its checks (placement needs that), for the agent
        start ``boot_id`` (None: this one's, ``self.boot_id``)."""
        event = NodeEvent(node_id=f"node-{self.id}", seq=seq, event="ready" if schedulable else "drained",
                          state="ready" if schedulable else "drained", executor_id=self.id, group=self.group,
                          schedulable=schedulable, boot_id=boot_id or self.boot_id)
        await bus.publish(self.c.js, self.c.s.node(event.node_id, event.event.value), event)

    async def stop(self) -> None:
        self.beating = False
        assert not await stop_tasks(self._tasks), "the fake executor's tasks did not stop"

    async def heartbeat_once(self) -> None:
        hb = Heartbeat(executor_id=self.id, node_id=f"node-{self.id}", group=self.group,
                       gpus=[{"index": i, "name": "fake"} for i in range(self.gpus)],
                       accepting=self.job_id is None, job_id=self.job_id, epoch=self.epoch,
                       phase=Phase.TRAINING if self.job_id else Phase.IDLE, sent_at=utcnow(),
                       interval_seconds=self.c.settings.heartbeat_seconds, progress_interval_seconds=1.0,
                       boot_id=self.boot_id)
        await bus.publish(self.c.js, self.c.s.heartbeat(self.id), hb)

    async def _heartbeat(self) -> None:
        while True:
            if self.beating:
                await self.heartbeat_once()
            await asyncio.sleep(0.3)

    async def _listen(self, sub: Any) -> None:
        while True:
            try:
                msgs = await sub.fetch(10, timeout=0.5)
            except TimeoutError:  # nats' own, or asyncio's plain one from a multi-message fetch
                continue
            for m in msgs:
                kind = m.subject.rsplit(".", 1)[-1]
                await self.directives.put(RunJob.decode(m.data) if kind == "run" else StopJob.decode(m.data))
                await m.ack()

    async def next_directive(self, timeout: float = 10.0) -> Envelope:
        return await asyncio.wait_for(self.directives.get(), timeout)

    async def take(self, timeout: float = 10.0) -> RunJob:
        """Wait for a RunJob and become busy with it."""
        run = await self.next_directive(timeout)
        assert isinstance(run, RunJob), run
        self.job_id, self.epoch = run.job_id, run.epoch
        return run

    async def renew(self, job_id: str | None = None, epoch: int | None = None) -> LeaseRenewReply:
        req = LeaseRenewRequest(job_id=job_id or self.job_id, epoch=epoch or self.epoch, executor_id=self.id)
        msg = await self.c.nc.request(self.c.s.rpc_lease_renew_of(self.id), req.encode(), timeout=5)
        return LeaseRenewReply.decode(msg.data)

    async def report(self, msg: Envelope) -> None:
        await bus.publish(self.c.js, self.c.s.progress(msg.job_id, msg.executor_id), msg)

    async def finish(self, outcome: RunOutcome, **kw: Any) -> None:
        await self.report(RunFinished(job_id=self.job_id, epoch=self.epoch, executor_id=self.id, outcome=outcome,
                                      **kw))
        self.job_id = self.epoch = None
