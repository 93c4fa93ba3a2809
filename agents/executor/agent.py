"""The executor agent: registers its node, heartbeats, takes lease grants and runs one training process at a time.

Directives (``teto.agent.<executor_id>.run|stop``) arrive on a durable pull consumer of the AGENT stream. A
grant (RunJob) is accepted only when idle and only after a renewal over request/reply confirms the lease is
still ours (a stale grant is dropped). While the process runs the lease keeper renews every heartbeat; if the
lease is refused, or no renewal was acknowledged for ``lease - stop_margin``, the process is killed before the
queue can redeliver the job, the agent takes no work, and reports ``abandoned`` once it reaches the server.
An unreachable server never crashes the agent: progress and usage records wait in memory, heartbeats are retried.
Here is the agent's contact with the queue (registration, heartbeats, directives, stops); serving one grant, start
to finish, is ``RunSupervision`` (supervision.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import logging
import os
import socket
import time
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from libs.contracts.agents import RunJob, StopJob
from libs.contracts.envelope import ContractError, RejectedMessage, new_id, utcnow
from libs.contracts.nodes import NodeRegistered, RebootNode, RunChecks
from libs.contracts.telemetry import GpuInfo, Heartbeat, Phase, RunFinished, RunOutcome
from libs.runtime import metrics, tracing
from libs.runtime.edge_stream import EdgeBroker, service_app

from . import directives  # the agent's FastStream app

from . import checkpoints, launch, pilot
from .checks import reach
from .checks.handler import NodeChecks
from .guard_client import Guard
from .publisher import Publisher
from .reports import Reports
from .run import Run, unreadable_grant
from .settings import ExecutorSettings
from .store.config import open_store
from .supervision import RunSupervision, log_failure
from .usage import UsageReports

log = logging.getLogger(__name__)

try:
    AGENT_VERSION = importlib.metadata.version("teto")
except importlib.metadata.PackageNotFoundError:
    AGENT_VERSION = "0+unknown"


class Agent(RunSupervision):
    def __init__(self, settings: ExecutorSettings, nc: Client, js: JetStreamContext, gpus: list[GpuInfo]) -> None:
        self.settings = settings
        self.subjects = settings.subjects
        self.id = settings.executor_id
        self.nc = nc
        self.js = js
        self.gpus = gpus
        self.publisher = Publisher(js, timeout=max(1.0, settings.heartbeat_seconds),
                                   retry_seconds=min(1.0, settings.heartbeat_seconds))
        self.usage = UsageReports(self.publisher, self.subjects, self.id, settings.node_id, settings.heartbeat_seconds)
        self.reports = Reports(self._send, settings.progress_interval_seconds)  # the process's own reports
        self.run: Run | None = None
        self.job_task: asyncio.Task | None = None
        self.stale_messages = 0
        self.rejected = 0
        self.checks = NodeChecks(settings, self.publisher, self)
        self.boot_id = new_id()  # a registration with a new boot id is a node back from a (re)boot
        self.address: str | None = None
        self.host = reach.advertised_host(settings.advertise_host)  # where gang peers reach rank 0 of a job here
        self.collective_port: int | None = None
        self.guard = Guard(launch.interpreter(settings))  # started with the first command run (guard.py)
        self.pilot = pilot.of(os.environ)  # a Slurm pilot: its job and node (pilot.py)
        self.leaving: str | None = None  # why this agent is on its way out (its Slurm allocation ends)
        self.store = open_store(settings)  # None: checkpoints stay in the (shared) checkpoint directory

    # -- what heartbeats say -------------------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        return self.run.phase if self.run else Phase.IDLE

    @property
    def accepting(self) -> bool:
        return self.run is None and not self.checks.active and self.leaving is None  # no job while checking

    async def register(self) -> None:
        try:
            torch_version = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            torch_version = None
        note = NodeRegistered(node_id=self.settings.node_id, executor_id=self.id, group=self.settings.group,
                              hostname=self.pilot.node if self.pilot else socket.gethostname(), gpus=self.gpus,
                              slurm_job_id=self.pilot.job_id if self.pilot else None, cpu_count=os.cpu_count() or 1,
                              torch_version=torch_version, agent_version=AGENT_VERSION, address=self.address,
                              collective_port=self.collective_port, boot_id=self.boot_id)
        await self.publisher.send(self.subjects.node(self.settings.node_id, "registered"), note)
        log.info("executor %s registered node %s in group %s with %d GPU(s)", self.id, self.settings.node_id,
                 self.settings.group, len(self.gpus))

    def heartbeat(self) -> Heartbeat:
        s, run = self.settings, self.run
        return Heartbeat(executor_id=self.id, node_id=s.node_id, group=s.group, gpus=self.gpus,
                         accepting=self.accepting, job_id=run.grant.job_id if run else None,
                         epoch=run.grant.epoch if run else None, phase=self.phase,
                         step=run.step if run else None, sent_at=utcnow(), interval_seconds=s.heartbeat_seconds,
                         progress_interval_seconds=s.progress_interval_seconds, address=self.host,
                         environments=s.environment_list, boot_id=self.boot_id)

    async def send_heartbeat(self, timeout: float) -> bool:
        """One heartbeat, now, waiting at most ``timeout`` for the server's ack."""
        return await self.publisher.publish_now(self.subjects.heartbeat(self.id), self.heartbeat(), timeout=timeout)

    async def heartbeats(self) -> None:
        s = self.settings
        while True:
            started = time.monotonic()
            await self.send_heartbeat(s.heartbeat_seconds)
            metrics.EXECUTOR_HEARTBEATS.inc()
            await asyncio.sleep(max(0.0, started + s.heartbeat_seconds - time.monotonic()))

    async def goodbye(self, why: str = "shutting down") -> None:
        """The agent is stopping: no new work (a grant arriving now is handed back at once, not left to wait out
        its lease), and one last heartbeat that says so, bounded, so placement stops choosing this executor
        before its heartbeats go silent. Its run, if any, reports its end as it stops (``SHUTDOWN_STOP``)."""
        if self.leaving is None:
            self.leaving = why
        await self.send_heartbeat(2.0)  # never raises (publish_now): a server out of reach costs the bound only

    # -- directives ----------------------------------------------------------------------------------------

    async def directives(self) -> None:
        """Receive directives as the agent's FastStream app (directives.py) until cancelled."""
        broker = EdgeBroker(self.nc, description=f"Teto executor {self.id}")
        self.app = service_app("executor", broker)
        directives.declare(broker, self.subjects, self.subjects.agent_all_of(self.id), f"agent-{self.id}",
                           directives.on_directive, agent=self)
        closed = False
        try:
            await broker.start()
            await asyncio.Event().wait()
        except GeneratorExit:  # closed without being cancelled (its loop is gone): nothing can be awaited now
            closed = True
            raise
        finally:
            if not closed:
                with contextlib.suppress(Exception):
                    await broker.stop()

    async def on_directive(self, msg: Msg) -> None:
        kind = msg.subject.rsplit(".", 1)[-1]
        model = {"run": RunJob, "stop": StopJob, "check": RunChecks, "reboot": RebootNode}.get(kind)
        directive: RunJob | StopJob | RunChecks | RebootNode | None = None
        if model is None:
            await self.reject(msg, f"unknown directive {kind!r}")
        else:
            try:
                directive = model.decode(msg.data)
            except ContractError as exc:
                await self.reject(msg, exc.reason)
                if model is RunJob:
                    await self._refuse_grant(msg, exc.reason)
            else:
                tracing.arrived(directive, msg.headers)  # a grant's run continues the job's trace
                if isinstance(directive, RunJob) and directive.executor_id != self.id:
                    await self.reject(msg, f"grant addressed to executor {directive.executor_id!r}, not {self.id!r}")
                    directive = None
        with contextlib.suppress(Exception):
            await msg.ack()
        if isinstance(directive, RunJob):
            self.on_run(directive)
        elif isinstance(directive, StopJob):
            self.on_stop(directive)
        elif isinstance(directive, RunChecks | RebootNode) and directive.executor_id != self.id:
            log.warning("directive for executor %s, not %s: ignored", directive.executor_id, self.id)
        elif isinstance(directive, RunChecks):
            self.checks.on_check(directive)
        elif isinstance(directive, RebootNode):
            self.checks.on_reboot(directive)

    def _hand_back(self, grant: RunJob, why: str) -> None:
        """A grant this agent cannot take goes back at once, unstarted (the queue requeues the job without
        spending an attempt and counts a hand-back), not silently dropped to wait out a whole lease."""
        log.warning("grant of job %s epoch %d handed back: %s", grant.job_id, grant.epoch, why)
        self._send(Run(grant), RunFinished, outcome=RunOutcome.HANDED_BACK, exit_code=None,
                   error=f"not started: {why}", last_step=None, resumed_from_step=None)

    async def _refuse_grant(self, msg: Msg, reason: str) -> None:
        """A grant this agent cannot read fails its attempt with the reason (``run.unreadable_grant``)."""
        found = unreadable_grant(msg.data, self.id, self.subjects, reason)
        if found is not None:
            log.error("grant of job %s epoch %s is unreadable: %s", found[1].job_id, found[1].epoch, reason)
            self.publisher.send(*found)

    async def reject(self, msg: Msg, reason: str) -> None:
        self.rejected += 1
        log.error("executor %s refused a directive on %s: %s", self.id, msg.subject, reason)
        note = RejectedMessage(service="executor", subject=msg.subject, reason=reason[:4000],
                               payload_excerpt=msg.data[:1000].decode("utf-8", "replace"), payload_bytes=len(msg.data))
        await self.publisher.publish_now(self.subjects.rejected("executor"), note)

    def on_run(self, grant: RunJob) -> None:
        if self.leaving is not None:
            self._hand_back(grant, f"the executor is leaving: {self.leaving}")
            return
        if self.checks.active:
            # Placement raced the node's check (the health service judged it from the test reports while the
            # check process is still finishing, or its "not schedulable" event was on the way).
            self._hand_back(grant, "the node is running its health checks")
            return
        run, task = self.run, self.job_task
        if run is not None:
            if (run.grant.job_id, run.grant.epoch) == (grant.job_id, grant.epoch):
                return  # the grant again (redelivered)
            if run.ended and task is not None:  # placed on our report of its end, still being acknowledged
                asyncio.create_task(self._after(task, grant)).add_done_callback(log_failure)
            else:
                self._hand_back(grant, f"the executor is busy with job {run.grant.job_id}")
            return
        self.run = Run(grant)  # set before any await: a second grant now sees us busy
        self.job_task = asyncio.create_task(self._serve_traced(self.run), name=f"job-{grant.job_id}")
        self.job_task.add_done_callback(log_failure)

    async def _after(self, task: asyncio.Task, grant: RunJob) -> None:
        await asyncio.wait({task})
        if task.cancelled():  # the agent is shutting down: the grant goes back rather than waiting out its lease
            self._hand_back(grant, "the executor is shutting down")
        else:
            self.on_run(grant)

    # -- what node checks need of the job (checks.handler.Jobs) ------------------------------------------------

    def running_job(self) -> str | None:
        return self.run.grant.job_id if self.run else None

    async def stop_and_wait(self, reason: str) -> None:
        run, task = self.run, self.job_task
        if run is None:
            return
        self.on_stop(StopJob(job_id=run.grant.job_id, epoch=run.grant.epoch, reason=reason, checkpoint_first=True,
                             grace_seconds=self.settings.stop_grace_seconds))
        if task is not None:
            await asyncio.wait({task})

    async def leave(self, why: str) -> None:
        """The pilot's allocation ends (the --signal lead, scancel, preemption): no new work, and the run
        checkpoints and stops, reported ``stopped`` so its job requeues without spending an attempt."""
        if self.leaving is None:
            log.warning("executor %s is leaving (%s): %s", self.id, why,
                        f"checkpointing and stopping job {self.run.grant.job_id}" if self.run else "no job runs")
        self.leaving = why
        await self.stop_and_wait(pilot.LEAVING)

    def on_stop(self, stop: StopJob) -> None:
        run = self.run
        if run is None or run.grant.job_id != stop.job_id:
            log.info("stop for job %s, which does not run here: nothing to do", stop.job_id)
            return
        if stop.epoch < run.grant.epoch:
            self.stale_messages += 1
            if self.stale_messages == 1:
                log.warning("ignoring stop for job %s with old epoch %d (current %d); further ones are only "
                            "counted", stop.job_id, stop.epoch, run.grant.epoch)
            return
        if run.stop_requested:
            return
        log.info("stopping job %s (epoch %d): %s", stop.job_id, run.grant.epoch, stop.reason)
        run.stop_requested = True
        run.stop_grace_seconds = stop.grace_seconds
        run.stop_reason = stop.reason
        run.phase = Phase.STOPPING
        run.verify_stop.set()  # a checkpoint being verified for it is not hashed on: the executor is freed now
        stop_file = launch.stop_file(self.settings, run.grant)
        with contextlib.suppress(OSError):
            stop_file.parent.mkdir(parents=True, exist_ok=True)
            checkpoints.write_atomic(stop_file, lambda f: (os.fchmod(f.fileno(), 0o644), f.write(json.dumps(
                {"checkpoint_first": stop.checkpoint_first, "reason": stop.reason}).encode())))
        if run.child is not None:
            asyncio.create_task(run.child.stop(stop.grace_seconds), name=f"stop-{stop.job_id}")

    # -- what a run reports (its progress subject) --------------------------------------------------------

    def _progress(self, run: Run, cls: type, **fields: Any) -> Any:
        return cls(job_id=run.grant.job_id, epoch=run.grant.epoch, executor_id=self.id, **fields)

    def _send(self, run: Run, cls: type, **fields: Any) -> asyncio.Future:
        return self.publisher.send(self.subjects.progress(run.grant.job_id, self.id), self._progress(run, cls, **fields))
