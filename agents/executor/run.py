"""One grant being served by the agent, and what its training process has reported so far (a value object)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from libs.contracts.agents import RunJob
from libs.contracts.envelope import ContractError
from libs.contracts.subjects import Subjects
from libs.contracts.telemetry import Phase, RunFinished, RunOutcome

from . import ckpt_fence, ckpt_quota, sandbox
from . import limits
from .checkpoints import Checkpoint
from .lease import LeaseLost
from .logsender import RunLog
from .runner import Child
from .sandbox import Sandbox
from .store.base import Store
from .store.fetch import fetch
from .store.uploader import Uploader

log = logging.getLogger(__name__)


class Prepared(NamedTuple):
    """What a run needs before its process can start, made while its lease is being confirmed: the checkpoint to
    resume from (None for a first run), the invalid ones skipped on the way (path, why), and the sandbox."""

    checkpoint: Checkpoint | None
    skipped: list[tuple[Path, str]]
    box: Sandbox


def resuming(settings: Any, grant: RunJob, store: object | None = None) -> bool:
    """Whether the run has checkpoints to verify (a first run has no directory: one stat call to learn it; with a
    store, whether the queue accepted one)."""
    if store is not None:
        return grant.resume_from is not None
    return os.path.lexists(settings.effective_checkpoint_dir / grant.job_id)


async def prepare(settings: Any, grant: RunJob, uid_start: int,
                  stopped: Callable[[], bool] | None = None, store: Store | None = None,
                  waiting: Callable[[str], None] | None = None) -> Prepared:
    """The checkpoint the queue accepted for the run to resume from (and the files skipped on the way: those never
    accepted are deleted, ckpt_fence.py) and its sandbox: local work only, done while the lease is being
    confirmed. Verification is bounded by the job's checkpoint quota (a larger file is skipped unread) and ends
    as soon as ``stopped()`` says the run was stopped (``VerificationStopped``, the thread returning within one
    chunk). Raises whatever keeps the sandbox from opening."""
    ckpt_dir = settings.effective_checkpoint_dir / grant.job_id
    quota = ckpt_quota.quota_of(grant.spec.checkpoint_quota_bytes, grant.checkpoint_quota_bytes)
    if store is not None:  # downloaded from the store and verified (store/restore.py), waiting while it is down
        ckpt, skipped = await fetch(store, grant, ckpt_dir, quota=quota, stopped=stopped, waiting=waiting)
    else:
        # Only rank 0 (the directory's writer) deletes what was never accepted.
        ckpt, skipped = (await asyncio.to_thread(ckpt_fence.resume_point, ckpt_dir, grant.resume_from,
                                                 clean=grant.rank == 0, quota=quota, stopped=stopped)
                         if resuming(settings, grant) else (None, []))
    box = await asyncio.to_thread(sandbox.open_for, settings, grant, start=uid_start)
    return Prepared(ckpt, skipped, box)


async def discard(preparing: asyncio.Task[Prepared]) -> None:
    """A preparation the run will not use (the grant was not confirmed, or the agent is stopping): waited for, and
    its sandbox closed (its uid released, its cgroup and directories removed). Never raises but for cancellation."""
    try:
        prepared = await preparing
    except asyncio.CancelledError:
        if not preparing.cancelled():
            raise
        return
    except Exception:  # noqa: BLE001 - it would have failed the run; no run, nothing to report
        log.debug("an unused run preparation failed", exc_info=True)
        return
    with contextlib.suppress(Exception):
        await prepared.box.close()


async def verified(run: Run, prepared: asyncio.Task[Prepared], lease_watch: asyncio.Task) -> Prepared | None:
    """The preparation, once done; None when the run was stopped or lost its lease while its checkpoint was being
    verified (``run.lost`` says which): the hash was abandoned, no sandbox is left open. A lost lease stops the
    verification at once rather than after it (the queue may already be placing the job elsewhere)."""
    await asyncio.wait({prepared, lease_watch}, return_when=asyncio.FIRST_COMPLETED)
    if not prepared.done():
        run.lost = lease_watch.result()
        run.verify_stop.set()
    try:
        made = await asyncio.shield(prepared)  # a stop of the agent meanwhile leaves it to ``discard``
    except ckpt_quota.VerificationStopped as exc:
        log.warning("job %s epoch %d: checkpoint verification stopped after %d bytes of %s", run.grant.job_id,
                    run.grant.epoch, exc.hashed, exc.path)
        return None
    if run.lost is not None:
        await made.box.close()
        return None
    return made


@dataclass
class Run:
    """One grant being served, and what its process has reported."""

    grant: RunJob
    phase: Phase = Phase.STARTING
    child: Child | None = None
    step: int | None = None
    resumed_from_step: int | None = None
    stop_requested: bool = False
    stop_grace_seconds: float | None = None  # the grace the stop carried (the queue's setting)
    stop_reason: str | None = None  # why it was stopped (gpu_ceiling: reported, so the queue interrupts the job)
    lost: LeaseLost | None = None
    pending_step: dict[str, Any] | None = None
    last_step_sent_at: float | None = None
    step_seconds_sum: float = 0.0
    step_seconds_n: int = 0
    launched_at: float | None = None  # monotonic
    ready: bool = False  # a gang worker's process group has formed
    log: RunLog | None = None  # its output on the way to the bus
    ended: bool = False  # its end is reported (being acknowledged): a new grant waits for it, not handed back
    # Set by any stop of the run (cancel, ceiling, lost lease, agent shutdown): a checkpoint being verified for it
    # stops being hashed (a thread cannot be cancelled; it looks at this between chunks).
    verify_stop: threading.Event = field(default_factory=threading.Event)
    metered_from: float | None = None  # monotonic: its devices are charged from here (verification or process start)
    over_limit: str | None = None  # a limit the agent ended it for (diskwatch.py): its error says so
    confirmed_file: Path | None = None  # where the last checkpoint step the bus took is written for the run
    retention: tuple[Path, int] | None = None  # its checkpoint directory and how many to keep (rank 0; keep > 0)
    uploader: Uploader | None = None  # its checkpoints on their way to the store (rank 0, with a store)

    def outcome(self, rc: int) -> RunOutcome:
        """How the run ended, its process having exited with ``rc``: a lost lease first (abandoned, a free
        requeue), then a stop the agent was asked for, then the exit status."""
        if self.lost is not None:
            return RunOutcome.ABANDONED
        if self.stop_requested:
            return RunOutcome.STOPPED
        if self.over_limit is not None:
            return RunOutcome.FAILED
        return RunOutcome.SUCCEEDED if rc == 0 else RunOutcome.FAILED

    def error(self, rc: int) -> str | None:
        """What went wrong, for the job's ``error``: the lost lease's reason, or the exit status with the end of
        the process's stderr (at most 8,000 characters, the end kept); None for a clean exit."""
        if self.lost is not None:
            return self.lost.reason
        if rc == 0 and self.over_limit is None:
            return None
        tail = self.child.stderr_tail().strip() if self.child else ""
        status = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
        box = self.child.sandbox if self.child else None
        if self.over_limit is not None:
            status = f"{status}, {self.over_limit}"
        elif box is not None and (why := limits.exit_reason(rc, box.plan, box.oom_killed)):
            status = f"{status}, {why}"
        elif box is not None and box.plan.enforced:
            status = f"{status} (limits: {'; '.join(box.plan.lines())})"
        return (f"{status}: {tail}" if tail else status)[-8000:]


def unreadable_grant(data: bytes, executor_id: str, subjects: Subjects, reason: str) -> tuple[str, RunFinished] | None:
    """The report that fails a grant this executor cannot read, and its subject, when the grant says which job and
    epoch it is for (and is not another executor's): otherwise the job would wait out its lease and be placed
    again, the same way, forever. None where it names no job this executor can report on."""
    try:
        body = json.loads(data)
        job_id, epoch, addressed = body["job_id"], body["epoch"], body.get("executor_id", executor_id)
        if addressed != executor_id:
            return None
        note = RunFinished(job_id=job_id, epoch=epoch, executor_id=executor_id, outcome=RunOutcome.FAILED,
                           error=f"the executor cannot read this grant: {reason}"[:8000])
        return subjects.progress(job_id, executor_id), note  # a job id that is no subject token names no job
    except (ValueError, TypeError, KeyError, ContractError) as exc:
        log.error("unreadable grant names no job the executor can report on (%r)", exc)
        return None
