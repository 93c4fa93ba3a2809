"""Playing the queue for executor tests: grants, a lease-renewal responder we can silence, and collectors of
what the agent publishes (core subscriptions see JetStream publishes as they happen)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nats.aio.client import Client

from libs.contracts.agents import AcceptedCheckpoint, RunJob, StopJob
from libs.contracts.jobs import CommandWorkload, FinetuneParams, FinetuneWorkload, JobSpec
from libs.contracts.leases import LeaseRenewReply, LeaseRenewRequest
from libs.contracts.subjects import Subjects
from libs.contracts.telemetry import PROGRESS_TYPES, Heartbeat
from libs.contracts.usage import UsageRecord, UsageReport
from libs.runtime import bus
from tests.support.services import eventually

ROOT = Path(__file__).resolve().parents[2]
TRAIN_SCRIPT = str(ROOT / "examples" / "train_script.py")




def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with contextlib.suppress(OSError):  # a zombie (dead, not yet reaped) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    return False


def command(env: dict[str, str] | None = None, *argv: str) -> CommandWorkload:
    return CommandWorkload(command=list(argv) or [sys.executable, TRAIN_SCRIPT], env=env or {})


def finetune(steps: int, **params: Any) -> FinetuneWorkload:
    return FinetuneWorkload(params=FinetuneParams(steps=steps, batch_size=4, seq_len=32, **params))


@dataclass
class FakeQueue:
    """Answers lease renewals (ok, refuse, or silence) and records what the agent publishes."""

    nc: Client
    subjects: Subjects
    executor_id: str
    answer: str = "ok"
    last_answer_at: float = 0.0
    renewals: list[LeaseRenewRequest] = field(default_factory=list)
    progress: list[Any] = field(default_factory=list)
    heartbeats: list[Heartbeat] = field(default_factory=list)
    usage: list[UsageRecord] = field(default_factory=list)  # every usage record reported, in arrival order
    raw: dict[str, list[bytes]] = field(default_factory=dict)
    _subs: list[Any] = field(default_factory=list)

    async def start(self) -> FakeQueue:
        self._subs = [await self.nc.subscribe(self.subjects.rpc_lease_renew, cb=self._on_renew),
                      await self.nc.subscribe(self.subjects.progress_all, cb=self._on_progress),
                      await self.nc.subscribe(self.subjects.heartbeat_all, cb=self._on_heartbeat),
                      await self.nc.subscribe(self.subjects.usage_all, cb=self._on_usage),
                      await self.nc.subscribe(self.subjects.rejected_all, cb=self._on_raw)]
        return self

    async def stop(self) -> None:
        for s in self._subs:
            with contextlib.suppress(Exception):
                await s.unsubscribe()

    async def _on_renew(self, msg: Any) -> None:
        req = LeaseRenewRequest.decode(msg.data)
        self.renewals.append(req)
        if self.answer == "silent":
            return
        ok = self.answer == "ok"
        await msg.respond(LeaseRenewReply(ok=ok, reason=None if ok else "stale epoch").encode())
        self.last_answer_at = time.monotonic()

    async def _on_progress(self, msg: Any) -> None:
        import json

        body = json.loads(msg.data)
        self.progress.append(PROGRESS_TYPES[body["kind"]].decode(msg.data))

    async def _on_heartbeat(self, msg: Any) -> None:
        self.heartbeats.append(Heartbeat.decode(msg.data))

    async def _on_usage(self, msg: Any) -> None:
        self.usage += UsageReport.decode(msg.data).records

    def records(self, job_id: str) -> list[UsageRecord]:
        return [r for r in self.usage if r.job_id == job_id]

    async def _on_raw(self, msg: Any) -> None:
        self.raw.setdefault(msg.subject, []).append(msg.data)

    # -- reading what happened
    def of(self, job_id: str, kind: str, epoch: int | None = None) -> list[Any]:
        return [p for p in self.progress if p.job_id == job_id and p.kind == kind
                and (epoch is None or p.epoch == epoch)]

    def accepted(self, job_id: str, *, before: int) -> AcceptedCheckpoint | None:
        """The last checkpoint reported for the job under an epoch before ``before`` (this fake holds every
        reporting executor to be the lease holder)."""
        reports = [p for p in self.of(job_id, "checkpoint") if p.epoch < before]
        last = reports[-1] if reports else None
        return None if last is None else AcceptedCheckpoint(step=last.step, sha256=last.sha256, epoch=last.epoch)

    def finished(self, job_id: str, epoch: int | None = None) -> Any:
        done = self.of(job_id, "finished", epoch)
        return done[-1] if done else None

    async def wait_finished(self, job_id: str, epoch: int | None = None, timeout: float = 60.0) -> Any:
        return await eventually(lambda: self.finished(job_id, epoch), timeout, f"job {job_id} to finish")

    # -- directives
    async def grant(self, js: Any, settings: Any, job_id: str, workload: Any, *, epoch: int = 1,
                    every: int = 5, attempt: int = 1, limits: dict[str, int] | None = None) -> RunJob:
        """Grant a run, resuming (as the queue does) from the last checkpoint reported under an earlier epoch."""
        msg = RunJob(job_id=job_id, epoch=epoch, executor_id=self.executor_id, attempt=attempt,
                     spec=JobSpec(workload=workload, checkpoint_every_steps=every, limits=limits or {}),
                     lease_seconds=settings.lease_seconds, heartbeat_seconds=settings.heartbeat_seconds,
                     resume_from=self.accepted(job_id, before=epoch))
        await bus.publish(js, self.subjects.agent(self.executor_id, "run"), msg)
        return msg

    async def stop_job(self, js: Any, job_id: str, epoch: int, *, checkpoint_first: bool) -> None:
        await bus.publish(js, self.subjects.agent(self.executor_id, "stop"),
                          StopJob(job_id=job_id, epoch=epoch, reason="test", checkpoint_first=checkpoint_first,
                                  grace_seconds=5))


@contextlib.asynccontextmanager
async def agent_with_fake_queue(settings: Any):
    """A running agent with ``settings``, a NATS connection for the test, and the fake queue in front of it:
    yields (settings, js, queue). The one way executor tests stand an agent up."""
    from agents.executor.main import serve
    from tests.support.services import running

    nc = await bus.connect(settings.nats_url, "test")
    js = nc.jetstream()
    queue = await FakeQueue(nc, settings.subjects, settings.executor_id).start()
    try:
        async with running(serve, settings):
            yield settings, js, queue
    finally:
        await queue.stop()
        await nc.close()

