"""Where the agent meets its checkpoint store, kept here so the agent's own modules only call in: a run's
uploader (rank 0, with a store), a reported checkpoint queued for upload instead of reported, the report once its
manifest is stored, the store's trouble shown on the job, and a finished run's pending uploads drained."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from libs.contracts.telemetry import CheckpointSkipped, CheckpointStoreNote, RunOutcome, StoreState

from ..run import Run
from . import files
from .base import Store, url_of
from .manifest import Manifest, manifest_key, shape
from .uploader import Upload, Uploader

log = logging.getLogger(__name__)

Send = Callable[..., Any]  # the agent's progress publisher: send(run, cls, **fields)
Report = Callable[..., None]  # Reports.stored(run, step, path, sha256, bytes, **stored)


def uploader_for(run: Run, store: Store, directory: Path, *, keep: int, concurrency: int, send: Send,
                 report: Report) -> Uploader:
    """Rank 0's uploads of the run's checkpoints to the store (``directory``: the job's local checkpoints)."""
    job_id = run.grant.job_id

    def stored(upload: Upload, made: Manifest, held: int | None) -> None:
        # Its manifest is in the store: now it is reported (the queue accepts it, a resume may use it).
        since = round(max(0.0, time.monotonic() - upload.queued_at), 3) if upload.queued_at else 0.0
        kind, count = shape(made)  # a stored directory shows as a directory, as one reported in place does
        report(run, upload.step, url_of(store.location, manifest_key(job_id, upload.step, upload.epoch)),
               upload.sha256, made.bytes, upload_seconds=since, stored_bytes=held, checkpoint_kind=kind,
               files=count)

    def skipped(upload: Upload, name: str, why: str) -> None:
        send(run, CheckpointSkipped, path=name, reason=f"step {upload.step} not stored: {why}")

    def retrying(upload: Upload, why: str) -> None:
        # Once an upload: the job shows that the store is failing it and how far behind the store is.
        send(run, CheckpointStoreNote, state=StoreState.UPLOADING, store=store.location, step=upload.step,
             path=upload.rel, bytes=upload.bytes, behind=len(run.uploader.behind if run.uploader else ()),
             reason=why[:8000])

    return Uploader(store, directory, on_stored=stored, on_skipped=skipped, on_retrying=retrying, keep=keep,
                    concurrency=concurrency)


def queue(run: Run, record: dict[str, Any], step: int, send: Send) -> None:
    """A checkpoint the run reported, queued for the store (not reported to the queue until stored); one that is
    not a checkpoint path under the job's directory is skipped at once."""
    grant, uploader = run.grant, run.uploader
    try:
        rel = files.relative(uploader.directory, record["path"])
    except files.NotACheckpoint as exc:
        send(run, CheckpointSkipped, path=str(record["path"]), reason=f"not uploaded: {exc}")
        return
    accepted = grant.resume_from
    parent = (accepted.step, accepted.epoch) if accepted is not None and accepted.epoch is not None else None
    sha = record.get("sha256")
    size = record.get("bytes") if isinstance(record.get("bytes"), int) else None
    uploader.submit(Upload(job_id=grant.job_id, epoch=grant.epoch, step=step, rel=rel,
                           sha256=sha if isinstance(sha, str) else None, bytes=size,
                           written_at=datetime.now(UTC).isoformat(), parent=parent, queued_at=time.monotonic()))
    send(run, CheckpointStoreNote, state=StoreState.UPLOADING, store=uploader.store.location, step=step, path=rel,
         bytes=size, behind=len(uploader.behind))


async def drain(run: Run, outcome: RunOutcome, seconds: float) -> None:
    """A run that ended (not abandoned: the job is someone else's then) reports its end once its checkpoints still
    uploading are stored, so the last one counts; at most ``seconds``, the lease renewed meanwhile."""
    uploader = run.uploader
    if uploader is None or outcome is RunOutcome.ABANDONED or not uploader.behind:
        return
    grant = run.grant
    log.info("job %s epoch %d: waiting for %d checkpoint upload(s) before reporting its end", grant.job_id,
             grant.epoch, len(uploader.behind))
    if not await uploader.drain(seconds):
        log.warning("job %s epoch %d: checkpoint uploads not done after %.0fs: %s", grant.job_id, grant.epoch,
                    seconds, uploader.last_error)
