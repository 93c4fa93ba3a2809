"""The executor agent: registers its node, heartbeats, takes lease grants and runs one training process at a time.

Directives (``teto.agent.<executor_id>.run|stop``) arrive on a durable pull consumer of the AGENT stream. A
grant (RunJob) is accepted only when idle and only after a renewal over request/reply confirms the lease is
still ours (a stale grant is dropped). While the process runs the lease keeper renews every heartbeat; if the
lease is refused, or no renewal was acknowledged for ``lease - stop_margin``, the process is killed before the
queue can redeliver the job, the agent takes no work, and reports ``abandoned`` once it reaches the server.
An unreachable server never crashes the agent: progress and usage records wait in memory, heartbeats are retried.
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
from datetime import timedelta
from typing import Any

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from libs.contracts.agents import RunJob, StopJob
from libs.contracts.jobs import CommandWorkload
from libs.contracts.envelope import ContractError, RejectedMessage, new_id, utcnow
from libs.contracts.nodes import NodeRegistered, RebootNode, RunChecks
from libs.contracts.telemetry import (CheckpointSkipped, CheckpointStoreNote, GpuInfo, Heartbeat, Phase, RunFinished,
                                      RunOutcome, RunStarted, StoreState)
from libs.runtime import logs, metrics, tracing
from libs.runtime.edge_stream import EdgeBroker, service_app

from . import directives  # the agent's FastStream app

from . import ceiling, checkpoints, diskwatch, launch, pilot, sandbox
from .checks import reach
from .checks.handler import NodeChecks
from .guard_client import Fence, Guard
from .lease import LeaseKeeper, LeaseLost
from .logsender import RunLog
from .publisher import Publisher
from .reports import Reports
from .run import Prepared, Run, discard, fenced_at, prepare, resuming, unreadable_grant, verified
from .runner import Child
from .settings import ExecutorSettings
from .store import hooks
from .store.config import open_store
from .usage import UsageReports

log = logging.getLogger(__name__)

try:
    AGENT_VERSION = importlib.metadata.version("teto")
except importlib.metadata.PackageNotFoundError:
    AGENT_VERSION = "0+unknown"
SHUTDOWN_GRACE_SECONDS = 5.0
FENCED = "ended by the run guard"  # the lost lease's reason when the guard ended the run first
LOG_CLOSE_SECONDS = 5.0  # the run's last output is shipped before its end is reported, waiting at most this
DISK_WATCH_SECONDS = 2.0  # how often a run's files are added up for its disk limit (diskwatch.py)


class Agent:
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

    async def heartbeats(self) -> None:
        s = self.settings
        while True:
            started = time.monotonic()
            run = self.run
            beat = Heartbeat(executor_id=self.id, node_id=s.node_id, group=s.group, gpus=self.gpus,
                             accepting=self.accepting, job_id=run.grant.job_id if run else None,
                             epoch=run.grant.epoch if run else None, phase=self.phase,
                             step=run.step if run else None, sent_at=utcnow(),
                             interval_seconds=s.heartbeat_seconds,
                             progress_interval_seconds=s.progress_interval_seconds, address=self.host,
                             environments=s.environment_list)
            await self.publisher.publish_now(self.subjects.heartbeat(self.id), beat, timeout=s.heartbeat_seconds)
            metrics.EXECUTOR_HEARTBEATS.inc()
            await asyncio.sleep(max(0.0, started + s.heartbeat_seconds - time.monotonic()))

    # -- directives ----------------------------------------------------------------------------------------

    async def directives(self) -> None:
        """Receive directives as the agent's FastStream app (directives.py) until cancelled."""
        broker = EdgeBroker(self.nc, description=f"Teto executor {self.id}")
        self.app = service_app("executor", broker)
        directives.declare(broker, self.subjects, self.subjects.agent_all_of(self.id), f"agent-{self.id}",
                           directives.on_directive, agent=self)
        try:
            await broker.start()
            await asyncio.Event().wait()
        finally:
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
                asyncio.create_task(self._after(task, grant)).add_done_callback(_log_failure)
            else:
                self._hand_back(grant, f"the executor is busy with job {run.grant.job_id}")
            return
        self.run = Run(grant)  # set before any await: a second grant now sees us busy
        self.job_task = asyncio.create_task(self._serve_traced(self.run), name=f"job-{grant.job_id}")
        self.job_task.add_done_callback(_log_failure)

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

    def _uid_start(self) -> int:
        """Where the search for a free workload uid starts: random per run (a uid rarely reused soon, or contended)."""
        return int.from_bytes(os.urandom(4), "big")

    # -- one grant, start to finish ------------------------------------------------------------------------

    def _progress(self, run: Run, cls: type, **fields: Any) -> Any:
        return cls(job_id=run.grant.job_id, epoch=run.grant.epoch, executor_id=self.id, **fields)

    def _send(self, run: Run, cls: type, **fields: Any) -> asyncio.Future:
        return self.publisher.send(self.subjects.progress(run.grant.job_id, self.id), self._progress(run, cls, **fields))

    async def _serve_traced(self, run: Run) -> None:
        """The run in the job's trace: its reports carry it back, its process inherits it (TRACEPARENT)."""
        with tracing.continued(tracing.of(run.grant), "executor run", new_trace=False, job_id=run.grant.job_id,
                               epoch=run.grant.epoch, executor_id=self.id):
            await self._serve_grant(run)

    async def _serve_grant(self, run: Run) -> None:
        grant = run.grant
        s = self.settings
        logs.bind_here(job_id=grant.job_id)  # this task's log lines are about the job
        metrics.EXECUTOR_RUNNING.set(1)
        keeper = LeaseKeeper(self.nc, self.subjects.rpc_lease_renew_of(self.id), job_id=grant.job_id, epoch=grant.epoch,
                             executor_id=self.id, lease_seconds=grant.lease_seconds,
                             heartbeat_seconds=grant.heartbeat_seconds,
                             stop_margin_seconds=min(s.effective_stop_margin, grant.lease_seconds / 2))
        watch: asyncio.Task | None = None
        spent: asyncio.Task | None = None
        disk: asyncio.Task | None = None
        # The run's checkpoint and sandbox are prepared while the queue confirms the lease (a round trip each):
        # nothing of them leaves the node before the confirmation, and an unconfirmed grant's sandbox is closed.
        verifying = time.monotonic() if resuming(s, grant, self.store) else None
        prepared: asyncio.Task[Prepared] | None = asyncio.create_task(self._prepare(run), name=f"prep-{grant.job_id}")
        try:
            reply = await keeper.acquire()
            if reply is None or not reply.ok:
                why = "no answer" if reply is None else (reply.reason or "refused")
                log.warning("grant of job %s epoch %d not confirmed (%s): dropped", grant.job_id, grant.epoch, why)
                return
            # Renewing while the run is being prepared too (a base model to build, directories to hand over).
            watch = asyncio.create_task(keeper.watch(), name=f"lease-{grant.job_id}")
            if verifying is not None:  # the job's devices are held for its checkpoint's verification: charged
                self._meter(run, verifying)
                spent = self._watch_ceiling(run)
            made = await verified(run, prepared, watch)
            prepared = None
            if made is None:  # stopped, or the lease lost, while its checkpoint was being verified
                await self._unstarted(run)
                return
            keeper.on_extended = lambda until: self._extend(run, until)
            if not await self._launch(run, made, keeper.contact.deadline):
                return
            spent = spent or self._watch_ceiling(run)
            disk = self._watch_disk(run)
            exited = asyncio.create_task(self._exit_of(run), name=f"wait-{grant.job_id}")
            await asyncio.wait({watch, exited}, return_when=asyncio.FIRST_COMPLETED)
            if exited.done() and run.lost is None and (
                    keeper.contact.lost(time.monotonic()) or fenced_at(run.fences, run.exited_at)):
                # Past the lease's deadline the run guard ended it (this agent too slow or frozen to): abandoned,
                # never a training failure of the job's.
                run.lost = LeaseLost(f"{FENCED}: no renewal acknowledged within lease - stop margin", refused=False)
            if not exited.done():
                run.lost = watch.result()
                run.phase = Phase.ABANDONED
                log.error("job %s epoch %d: %s; killing process %d", grant.job_id, grant.epoch, run.lost.reason,
                          run.child.pid)
                await run.child.stop(s.abandon_grace_seconds)
            rc = await exited
            self.usage.finish()
            await hooks.drain(run, run.outcome(rc), s.checkpoint_upload_drain_seconds)
            await self._finish(run, run.outcome(rc), rc, run.error(rc))
        except asyncio.CancelledError:
            # The agent is shutting down: the process must not outlive it. Report abandoned (free) if we can.
            run.verify_stop.set()  # a verification in progress ends within a chunk, so ``discard`` returns soon
            if run.child is None:
                self.usage.finish()  # its verification's time, if it was metered
            else:
                await run.child.stop(min(s.stop_grace_seconds, SHUTDOWN_GRACE_SECONDS))
                self.usage.finish()
                if run.log is not None:
                    await run.log.close(run.child.proc.returncode, timeout=1.0)
                await self.publisher.publish_now(self.subjects.progress(grant.job_id, self.id), self._progress(
                    run, RunFinished, outcome=RunOutcome.ABANDONED, last_step=run.step,
                    resumed_from_step=run.resumed_from_step, error="executor shut down"), timeout=2.0)
            raise
        except Exception as exc:  # noqa: BLE001 - whatever went wrong, the run ends visibly, never silently
            await self._fail(run, exc)
        finally:
            run.verify_stop.set()
            if run.uploader is not None:  # an upload cut here never gets its manifest: not a checkpoint
                await run.uploader.close()
            if prepared is not None:  # not confirmed, or the agent is stopping: the sandbox is not used
                await discard(prepared)
            for task in (watch, spent, disk):
                if task is not None:
                    task.cancel()
            if self.run is run:
                self.run = None
                metrics.EXECUTOR_RUNNING.set(0)

    async def _prepare(self, run: Run) -> Prepared:
        def waiting(why: str) -> None:
            self._send(run, CheckpointStoreNote, state=StoreState.WAITING, store=self.store.location, reason=why)
        return await prepare(self.settings, run.grant, self._uid_start(), stopped=run.verify_stop.is_set,
                             store=self.store, waiting=waiting)

    def _meter(self, run: Run, since: float) -> None:
        """Charge the run's devices from ``since`` (monotonic): its checkpoint's verification or its process's
        start, whichever came first (docs/budget-and-audit.md). Once per run: a second start would reuse seqs."""
        if run.metered_from is not None:
            return
        run.metered_from = since
        self.usage.meter.start(run.grant.job_id, run.grant.epoch, launch.devices_held(run.grant, self.gpus), since,
                               utcnow() - timedelta(seconds=max(0.0, time.monotonic() - since)))

    async def _unstarted(self, run: Run) -> None:
        """The run ended while its checkpoint was being verified: its process never started. A lost lease is
        abandoned (free); a stop (cancel, ceiling) is stopped; the verification's time is charged either way."""
        self.usage.finish()
        if run.lost is not None:
            run.phase = Phase.ABANDONED
            await self._finish(run, RunOutcome.ABANDONED, None, run.lost.reason)
        else:
            await self._finish(run, RunOutcome.STOPPED, None,
                               "stopped while its checkpoint was being verified, before the process started")

    def _fence(self, until: float) -> Fence:
        """The run guard's deadline for a run: the lease's own (lease - stop margin since the last acknowledged
        renewal), then the same grace as the agent's own abandoning (guard.py ends the run at it by itself)."""
        return Fence(until=until, grace=self.settings.abandon_grace_seconds)

    async def _extend(self, run: Run, until: float) -> None:
        if run.child is not None and run.child.launch.guarded and run.child.proc.returncode is None:
            if await self.guard.extend(run.child.pid, self._fence(until)):
                run.fences.append((time.monotonic(), until))

    async def _exit_of(self, run: Run) -> int:
        """The run's exit status, with the moment it was seen (``fenced_at`` compares it with the guard's deadline
        then: a renewal acknowledged late moves the agent's own deadline on after the guard has already acted)."""
        rc = await run.child.wait()
        run.exited_at = time.monotonic()
        return rc

    async def _launch(self, run: Run, prepared: Prepared, deadline: float) -> bool:
        """Start the training process of a confirmed grant, and report it started; False when a stop came first
        (the run is finished then). Raises whatever keeps the process from starting (``_fail`` reports it)."""
        grant = run.grant
        s = self.settings
        ckpt, skipped, box = prepared
        for path, reason in skipped:
            log.warning("job %s: skipping checkpoint %s: %s", grant.job_id, path, reason)
            self._send(run, CheckpointSkipped, path=str(path), reason=reason)
        run.resumed_from_step = ckpt.step if ckpt else None
        if run.stop_requested:
            await box.close()
            self.usage.finish()
            await self._finish(run, RunOutcome.STOPPED, None, "stopped before the process started")
            return False
        try:
            resume = ckpt.path if ckpt else None
            if resume is not None and box.uid is not None and grant.rank > 0:
                resume = await asyncio.to_thread(sandbox.hand_over, resume, launch.job_dir(s, grant.job_id), box)
            work = launch.build(grant, s, self.gpus, resume_from=resume, base_env=os.environ)
            if box.uid is not None and not isinstance(grant.spec.workload, CommandWorkload):
                await sandbox.prepare_base(s.effective_base_model_dir)
            run.log = RunLog(self.js, self.subjects, grant, self.id, s.log_limits)
            run.confirmed_file = launch.confirmed_file(s, grant)
            kept = s.checkpoints_kept if grant.spec.checkpoints_kept is None else grant.spec.checkpoints_kept
            run.retention = (launch.checkpoint_dir(s, grant.job_id), kept) if grant.rank == 0 and kept > 0 else None
            if self.store is not None and grant.rank == 0:  # its checkpoints go to the store (store/hooks.py)
                run.uploader = hooks.uploader_for(
                    run, self.store, launch.absolute(s.effective_checkpoint_dir) / grant.job_id, keep=kept,
                    concurrency=s.checkpoint_store_concurrency, send=self._send, report=self.reports.stored)
            run.child = await Child.start(work, lambda record: self.reports.on_report(run, record), box,
                                          on_output=run.log.write, guard=self.guard, fence=self._fence(deadline))
            run.fences = [(time.monotonic(), deadline)]
        except BaseException:
            await box.close()
            raise
        if run.stop_requested:
            # The stop came while the process was being started (no child to signal then): stop it now,
            # or a ceiling stop would be lost and the job would run on past its budget.
            asyncio.create_task(run.child.stop(run.stop_grace_seconds or s.stop_grace_seconds),
                                name=f"stop-{grant.job_id}")
        run.launched_at = time.monotonic()
        # Every worker, gang or not, is metered from its process's start (or its checkpoint's verification,
        # earlier): forming a gang uses the devices.
        self._meter(run, run.launched_at)
        log.info("job %s epoch %d started as process %d, resuming from step %s", grant.job_id, grant.epoch,
                 run.child.pid, run.resumed_from_step)
        for line in box.plan.not_enforced:
            log.warning("job %s epoch %d: limit not fully enforced on this host: %s", grant.job_id, grant.epoch, line)
        detail = {"pid": run.child.pid, "attempt": grant.attempt, "node_id": s.node_id, "rank": grant.rank,
                  "world_size": grant.world_size, "confinement": confinement_of(box)}
        if self.pilot is not None:  # the allocation it runs in, and a warning when its ceiling outlasts it
            detail["allocation"] = pilot.allocation(self.pilot, await pilot.time_left(self.pilot),
                                                    grant.remaining_gpu_seconds,
                                                    launch.devices_held(grant, self.gpus))
        self._send(run, RunStarted, resumed_from_step=run.resumed_from_step,
                   resumed_from=str(ckpt.path) if ckpt else None, device=launch.device(self.gpus), detail=detail)
        return True

    def _watch_ceiling(self, run: Run) -> asyncio.Task:
        """The ceiling by this agent's own monotonic clock, from the process's start (see ceiling.py)."""
        grant = run.grant

        def spent() -> None:
            log.warning("job %s epoch %d: its %.1f GPU-seconds left at grant time are spent; stopping it",
                        grant.job_id, grant.epoch, grant.remaining_gpu_seconds or 0.0)
            self.on_stop(StopJob(job_id=grant.job_id, epoch=grant.epoch, reason=ceiling.CEILING_STOP,
                                 checkpoint_first=True, grace_seconds=self.settings.stop_grace_seconds))

        task = asyncio.create_task(ceiling.watch(
            launch.devices_held(grant, self.gpus), run.metered_from or time.monotonic(), grant.remaining_gpu_seconds,
            grant.world_size, time.monotonic, spent), name=f"ceiling-{grant.job_id}")
        task.add_done_callback(_log_failure)
        return task

    def _watch_disk(self, run: Run) -> asyncio.Task:
        """The run's disk limit over all its files (diskwatch.py): past it the run is ended, its error says why."""
        grant = run.grant

        def over(why: str) -> None:
            log.warning("job %s epoch %d: %s; ending it", grant.job_id, grant.epoch, why)
            run.over_limit = why
            if run.child is not None:
                asyncio.create_task(run.child.stop(self.settings.abandon_grace_seconds), name=f"disk-{grant.job_id}")

        task = asyncio.create_task(diskwatch.watch(launch.run_dirs(self.settings, grant), grant.spec.limits.disk_mb,
                                                   DISK_WATCH_SECONDS, over), name=f"disk-{grant.job_id}")
        task.add_done_callback(_log_failure)
        return task

    async def _fail(self, run: Run, exc: Exception) -> None:
        """The run could not start (bad environment, missing program, no permission, unreadable checkpoint
        directory...) or the agent failed while serving it: the attempt fails with the reason. Never a silent
        end: the queue would only learn of it when the lease expires, call it a transport loss, spend no
        attempt, and place the same job again, forever."""
        grant = run.grant
        if run.child is None:
            error = launch.cannot_start(grant, exc)
            # the traceback too when the reason is not one the launch itself gave (a bug, not bad input)
            log.error("job %s epoch %d: %s", grant.job_id, grant.epoch, error,
                      exc_info=None if isinstance(exc, launch.CannotStart) else exc)
        else:
            log.exception("job %s epoch %d: the executor failed while serving the run", grant.job_id, grant.epoch)
            await run.child.stop(self.settings.abandon_grace_seconds)
            error = f"the executor failed while serving the run: {type(exc).__name__}: {exc}"
        self.usage.finish()
        await self._finish(run, RunOutcome.FAILED, run.child.proc.returncode if run.child else None, error[-8000:])

    async def _finish(self, run: Run, outcome: RunOutcome, rc: int | None, error: str | None) -> None:
        self.reports.flush_step(run)
        if outcome is RunOutcome.ABANDONED:
            run.phase = Phase.ABANDONED  # not accepting until the server has our report: contact is back
        if run.log is not None:  # its output before its end: a reader following the job sees all of it
            # (briefly when contact was lost: the bus is likely away, and the end report matters more)
            await run.log.close(rc, timeout=1.0 if outcome is RunOutcome.ABANDONED else LOG_CLOSE_SECONDS)
        log.info("job %s epoch %d finished: %s (exit %s)", run.grant.job_id, run.grant.epoch, outcome, rc)
        metrics.EXECUTOR_RUNS.labels(outcome.value).inc()
        # Retried until the server acknowledges it; only then does the agent take new work (one granted on it
        # meanwhile waits: the queue frees the executor on this report, services/queue/runs.py).
        run.ended = True
        await self._send(run, RunFinished, outcome=outcome, exit_code=rc, error=error, last_step=run.step,
                         resumed_from_step=run.resumed_from_step,
                         stop_reason=run.stop_reason if outcome is RunOutcome.STOPPED else None)


def confinement_of(box: sandbox.Sandbox) -> dict[str, Any]:
    """What holds the run, for its ``started`` event: the limits and how each holds here, what does not hold,
    and the seccomp filter (confine.py)."""
    return {"limits": dict(box.plan.enforced), "not_enforced": list(box.plan.not_enforced),
            "seccomp": "no new namespaces (unshare, clone CLONE_NEW*, setns refused), no_new_privs"
            if sandbox.confinement().filters else "NOT ENFORCED: no seccomp filter for this machine; no_new_privs only"}


def _log_failure(task: asyncio.Task) -> None:
    """A background task that ends with an exception says so (asyncio would only mention it at exit, if ever)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("task %s failed", task.get_name(), exc_info=task.exception())
