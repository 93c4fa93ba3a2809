"""One grant, start to finish: what the executor agent (agent.py) does with a grant it has taken.

The lease is confirmed over request/reply while the run's checkpoint and sandbox are prepared; then the process
starts (through the run guard for a ``command``), the lease keeper renews and moves the guard's deadline on, the
ceiling and the disk limit are watched, and the run's end is reported once, whatever ended it: its exit, a stop,
the lease lost (the process killed first), a failure to start, or the agent shutting down. ``RunSupervision`` is
the part of ``Agent`` that does this; the agent's contact with the queue (registration, heartbeats, directives,
stops) stays in agent.py.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from nats.aio.client import Client
from nats.js import JetStreamContext

from libs.contracts.envelope import utcnow
from libs.contracts.agents import StopJob
from libs.contracts.jobs import CommandWorkload
from libs.contracts.telemetry import (SHUTDOWN_STOP, CheckpointSkipped, CheckpointStoreNote, GpuInfo, Phase,
                                      RunFinished, RunOutcome, RunStarted, StoreState)
from libs.runtime import logs, metrics, tracing

from . import ceiling, diskwatch, launch, pilot, sandbox
from .guard_client import Fence, Guard
from .lease import LeaseKeeper, LeaseLost
from .logsender import RunLog
from .publisher import Publisher
from .reports import Reports
from .run import Prepared, Run, discard, prepare, resuming, verified
from .runner import Child
from .settings import ExecutorSettings
from .store import hooks
from .usage import UsageReports

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_SECONDS = 5.0
FENCED = "ended by the run guard"  # the lost lease's reason when the guard ended the run first
LOG_CLOSE_SECONDS = 5.0  # the run's last output is shipped before its end is reported, waiting at most this
DISK_WATCH_SECONDS = 2.0  # how often a run's files are added up for its disk limit (diskwatch.py)


class RunSupervision:
    """The run-serving half of ``Agent``: it uses the agent's connections, settings, publisher, usage meter,
    reports, guard and store, its ``_send``/``_progress`` of a run's reports and its ``on_stop``."""

    settings: ExecutorSettings
    subjects: Any  # the settings' subjects
    id: str
    nc: Client
    js: JetStreamContext
    gpus: list[GpuInfo]
    publisher: Publisher
    usage: UsageReports
    reports: Reports
    guard: Guard
    run: Run | None
    pilot: Any  # pilot.Pilot | None: the Slurm allocation the agent runs in
    store: Any  # the checkpoint store (store/config.py), None without one
    on_stop: Callable[[StopJob], None]
    _send: Callable[..., asyncio.Future]
    _progress: Callable[..., Any]

    def _uid_start(self) -> int:
        """Where the search for a free workload uid starts: random per run (a uid rarely reused soon, or contended)."""
        return int.from_bytes(os.urandom(4), "big")

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
            # The guard is given the lease's deadline as it stands when the process is spawned, not when the launch
            # began (a base model built, a checkpoint handed over: seconds on a loaded node, renewals meanwhile).
            if not await self._launch(run, made, lambda: keeper.contact.deadline):
                return
            # A renewal acknowledged while the process was being spawned found no process to move the guard's
            # deadline for: hand the guard the lease's deadline now.
            await self._extend(run, keeper.contact.deadline)
            spent = spent or self._watch_ceiling(run)
            disk = self._watch_disk(run)
            exited = asyncio.create_task(run.child.wait(), name=f"wait-{grant.job_id}")
            await asyncio.wait({watch, exited}, return_when=asyncio.FIRST_COMPLETED)
            if exited.done() and run.lost is None and (
                    keeper.contact.lost(time.monotonic()) or run.child.fenced):
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
                    resumed_from_step=run.resumed_from_step, error="executor shut down",
                    stop_reason=SHUTDOWN_STOP), timeout=2.0)
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
            await self.guard.extend(run.child.pid, self._fence(until))

    async def _launch(self, run: Run, prepared: Prepared, deadline: Callable[[], float]) -> bool:
        """Start the training process of a confirmed grant, and report it started; False when a stop came first
        (the run is finished then). Raises whatever keeps the process from starting (``_fail`` reports it).
        ``deadline``: the lease's deadline now, read for the run guard as the process is spawned."""
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
                                          on_output=run.log.write, guard=self.guard,
                                          fence=lambda: self._fence(deadline()))
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
        task.add_done_callback(log_failure)
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
        task.add_done_callback(log_failure)
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


def log_failure(task: asyncio.Task) -> None:
    """A background task that ends with an exception says so (asyncio would only mention it at exit, if ever)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("task %s failed", task.get_name(), exc_info=task.exception())
