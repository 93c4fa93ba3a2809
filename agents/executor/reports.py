"""What a training process says through ``teto.sdk`` (JSON lines on its report pipe), turned into progress
messages: steps throttled to one per progress interval, always carrying the latest step when the interval ends
(a line may stand for several steps the SDK held back, with their mean step time and ``step_seconds_n``);
a checkpoint only after the step it covers, and only within the job's checkpoint quota (a larger one, or one the
SDK refused itself, is a ``checkpoint_skipped`` with the reason); a gang worker's readiness; the phase.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from libs.contracts.bounds import MAX_SAFE_INT
from libs.contracts.telemetry import (CheckpointKind, CheckpointReport, CheckpointSkipped, Phase, StepReport,
                                      WorkerReady)

from . import ckpt_dir, ckpt_fence, ckpt_quota
from .run import Run
from .store import hooks

log = logging.getLogger(__name__)

Send = Callable[..., "asyncio.Future[Any]"]


def quota(run: Run) -> int:
    """The checkpoint quota this run applies (``ckpt_quota.quota_of`` its grant)."""
    return ckpt_quota.quota_of(run.grant.spec.checkpoint_quota_bytes, run.grant.checkpoint_quota_bytes)


def measured_size(path: object) -> int | None:
    """The size on disk of a reported checkpoint (a directory's: all its files, nothing read): a link is not
    followed (its own size, not its target's), and one that cannot be read has none (the report's own figure is
    judged then)."""
    try:
        if ckpt_dir.holds_checkpoint(Path(str(path))):
            return ckpt_dir.measured_size(Path(str(path)))
        return os.lstat(str(path)).st_size
    except (OSError, ValueError):
        return None


class Reports:
    """One per agent; ``send(run, cls, **fields)`` is the agent's (retried, epoch-stamped) progress publisher."""

    def __init__(self, send: Send, progress_interval_seconds: float) -> None:
        self.send = send
        self.progress_interval_seconds = progress_interval_seconds
        # A step held back by the throttle is sent when its interval ends even if no later report comes (a
        # script that reports 1-10 at once and then hangs must show 10, not 1): one timer per run, by id.
        self._due: dict[int, asyncio.TimerHandle] = {}

    def on_report(self, run: Run, record: dict[str, Any]) -> None:
        kind = record.get("type")
        if kind == "step":
            step = int(record["step"])
            if not 0 <= step <= MAX_SAFE_INT:  # every heartbeat carries it: one the contract refuses stops them all
                raise ValueError(f"step {step} is outside 0..2**53")
            run.step = step
            if run.phase is Phase.STARTING:
                run.phase = Phase.TRAINING
            if isinstance(record.get("step_seconds"), int | float):
                # A line may stand for several steps (the SDK holds steps back: sdk_steps.py): weigh its mean.
                n = record.get("step_seconds_n")
                n = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_SAFE_INT else 1
                run.step_seconds_sum += float(record["step_seconds"]) * n
                run.step_seconds_n += n
            run.pending_step = record
            now = time.monotonic()
            last = run.last_step_sent_at
            total = record.get("total_steps")
            if last is None or now - last >= self.progress_interval_seconds or run.step == total:
                self.flush_step(run)
            else:
                self._flush_when_due(run, last + self.progress_interval_seconds - now)
        elif kind == "checkpoint":
            self.flush_step(run)  # the step a checkpoint covers is reported before the checkpoint
            refused = ckpt_quota.report_refusal(record.get("bytes"), measured_size(record["path"]), quota(run))
            if refused is not None:  # refused when written, so a resume never meets (or hashes) it
                log.warning("job %s: checkpoint %s refused: %s", run.grant.job_id, record["path"], refused)
                self.send(run, CheckpointSkipped, path=str(record["path"]), reason=refused)
                return
            if run.uploader is not None:  # reported once its manifest is stored (store/hooks.py), not before
                hooks.queue(run, record, int(record["step"]), self.send)
                return
            step = int(record["step"])
            shape = CheckpointKind.DIRECTORY if record.get("kind") == "directory" else CheckpointKind.FILE
            sent = self.send(run, CheckpointReport, step=step, path=str(record["path"]),
                             sha256=record.get("sha256"), bytes=record.get("bytes"), checkpoint_kind=shape,
                             files=record.get("files") if shape is CheckpointKind.DIRECTORY else None)
            if run.confirmed_file is not None and isinstance(sent, asyncio.Future):
                # Retention in the run deletes older checkpoints only up to a reported one (ckpt_fence.py): a run
                # whose reports go nowhere (its agent frozen, its bus cut) never deletes the one the queue accepted.
                sent.add_done_callback(lambda done: _confirmed(done, run, step))
        elif kind == "checkpoint_refused":  # the SDK refused it itself (its file is gone): the person sees why
            size = record.get("bytes")
            why = ckpt_quota.over_quota(size, quota(run)) if isinstance(size, int) else None
            self.send(run, CheckpointSkipped, path=str(record.get("path") or "?"),
                      reason=why or f"refused by the training process: over the checkpoint quota of {quota(run)} bytes")
        elif kind == "checkpoint_invalid":  # the SDK refused to seal a directory (a link inside): the person sees why
            self.send(run, CheckpointSkipped, path=str(record.get("path") or "?"),
                      reason=str(record.get("reason") or "refused by the training process")[:1000])
        elif kind == "ready" and not run.ready and run.grant.world_size > 1:
            self.on_ready(run)
        elif kind == "phase" and run.phase in (Phase.TRAINING, Phase.CHECKPOINTING, Phase.STARTING):
            phase = record.get("phase")
            if phase in (Phase.TRAINING, Phase.CHECKPOINTING):
                run.phase = Phase(phase)

    def stored(self, run: Run, step: int, path: str, sha256: str | None, size: int | None,
               **stored: float | int | CheckpointKind | None) -> None:
        """A checkpoint in the store (its manifest written: store/hooks.py) reported to the queue, valid from then
        on; ``stored``: its ``upload_seconds``, ``stored_bytes``, ``checkpoint_kind`` and ``files``. Retention
        follows once the bus has it, as for a checkpoint reported at once."""
        extra = {k: v for k, v in stored.items() if v is not None}
        sent = self.send(run, CheckpointReport, step=step, path=path, sha256=sha256, bytes=size, **extra)
        if run.confirmed_file is not None and isinstance(sent, asyncio.Future):
            sent.add_done_callback(lambda done: _confirmed(done, run, step))

    def on_ready(self, run: Run) -> None:
        """The process group formed: the gang worker is ready (its time is metered since its process started)."""
        run.ready = True
        now = time.monotonic()
        grant = run.grant
        since = None if run.launched_at is None else round(now - run.launched_at, 3)
        log.info("job %s epoch %d: rank %d of %d ready after %ss", grant.job_id, grant.epoch, grant.rank,
                 grant.world_size, since)
        self.send(run, WorkerReady, rank=grant.rank, world_size=grant.world_size, seconds_since_launch=since)

    def _flush_when_due(self, run: Run, delay: float) -> None:
        """Send the held step when the interval that throttled it ends (once per interval; the record sent is
        whatever is latest then). Outside an event loop (a plain call in a test) there is nothing to arm."""
        if id(run) in self._due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._due[id(run)] = loop.call_later(max(delay, 0.0), self._flush_due, run)

    def _flush_due(self, run: Run) -> None:
        self._due.pop(id(run), None)
        self.flush_step(run)

    def flush_step(self, run: Run) -> None:
        timer = self._due.pop(id(run), None)
        if timer is not None:
            timer.cancel()
        record = run.pending_step
        if record is None:
            return
        if run.grant.rank != 0:
            # In a gang every rank steps together; rank 0 speaks for the job (its heartbeat still says its step).
            run.pending_step = None
            run.step_seconds_sum, run.step_seconds_n = 0.0, 0
            return
        run.pending_step = None
        run.last_step_sent_at = time.monotonic()
        mean = run.step_seconds_sum / run.step_seconds_n if run.step_seconds_n else None
        run.step_seconds_sum, run.step_seconds_n = 0.0, 0
        metrics = record.get("metrics") if isinstance(record.get("metrics"), dict) else {}
        try:
            self.send(run, StepReport, step=int(record["step"]), total_steps=record.get("total_steps"),
                       loss=record.get("loss"), step_seconds=mean, metrics=metrics)
        except ValueError as exc:  # a figure the contract refuses (pydantic's ValidationError is a ValueError)
            # Dropped, never raised: this also runs when the run finishes, and that report must still go out.
            log.warning("job %s: step report not sent: %s", run.grant.job_id, exc)


def _confirmed(done: asyncio.Future, run: Run, step: int) -> None:
    """The bus has the checkpoint's report (True) or dropped it: only then may retention reach it, the run's own
    (told through its confirmation file) and the agent's, now (the run's next checkpoint may never come)."""
    if not done.cancelled() and done.exception() is None and done.result() and run.confirmed_file is not None:
        ckpt_fence.confirm(run.confirmed_file, step)
        if run.retention is not None:
            ckpt_fence.retain(*run.retention, step)
