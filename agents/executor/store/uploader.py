"""The agent's background uploads of one run's checkpoints to the store: the run never waits for them.

The run writes each checkpoint locally and reports it; the agent queues it here instead of reporting it. One
checkpoint is uploaded at a time, in step order, its objects several at once (``concurrency``), each hashed as
it is read and retried with back-off while the store is unavailable; its manifest goes last, and only then is
``on_stored`` told (the agent reports the checkpoint to the queue: from then on it is valid, it counts for the
interruption cost and a resume may use it). A checkpoint queued behind the one in flight is superseded by a
newer one (``supersede``): when the store falls behind it catches up with the newest, never the reverse.
A failure no retry can mend (the file is gone, changed since reported, a link, the store refuses) skips that
checkpoint (``on_skipped``, with the object's name) and the next one goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from . import files
from . import manifest
from .base import Store, StoreError, StoreRefused

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Upload:
    """A checkpoint the run reported, waiting for (or in) its upload."""

    job_id: str
    epoch: int
    step: int
    rel: str  # its path under the job's checkpoint directory
    sha256: str | None
    bytes: int | None
    written_at: str
    parent: tuple[int, int] | None = None
    queued_at: float | None = None  # monotonic, when the run reported it


@dataclass(frozen=True)
class Backoff:
    """Seconds before retry ``n`` (0-based): ``first`` doubling up to ``cap``. Pure."""

    first: float = 0.5
    cap: float = 30.0

    def delay(self, n: int) -> float:
        return min(self.cap, self.first * (2 ** min(n, 30)))


def supersede(queue: Sequence[Upload], new: Upload) -> tuple[list[Upload], list[Upload]]:
    """The queue once ``new`` joins it, and the uploads it supersedes: every queued one older than it (never the
    one in flight, which is not in the queue). A report of a step already queued or older than the newest queued
    one supersedes nothing and is itself superseded (the run's steps only grow; a repeated report is old news).
    Pure."""
    if any(u.step >= new.step for u in queue):
        return list(queue), [new]
    return [new], list(queue)


NICE = 10  # the upload threads' CPU priority (Linux nice: the training process runs at 0)


def lower_priority(nice: int = NICE) -> None:
    """Lower the calling thread's CPU priority (never raise it): nice ``nice`` and Linux's idle scheduling class
    (``SCHED_IDLE``: it runs on what the other threads of a core leave). On Linux both are the thread's own and
    the threads it starts inherit them (the client's multipart threads), so the agent's hashing and uploads yield
    a shared core to the training process instead of stalling its steps; nice 10 alone left the step 1.4-2.3x
    slower on the 2-core bench, idle 1.00x (docs/checkpoint-store.md). Elsewhere, or where refused, nothing
    changes."""
    if not hasattr(os, "setpriority") or not hasattr(threading, "get_native_id"):
        return
    tid = threading.get_native_id()
    with contextlib.suppress(OSError):
        if os.getpriority(os.PRIO_PROCESS, tid) < nice:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    with contextlib.suppress(OSError, AttributeError):  # 0: the calling thread
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


class Skipped(Exception):
    """This checkpoint cannot be stored; ``name`` is the object (or file) at fault."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason


class Uploader:
    def __init__(self, store: Store, directory: Path, *, on_stored: Callable[[Upload, manifest.Manifest, int | None], None],
                 on_skipped: Callable[[Upload, str, str], None], on_superseded: Callable[[Upload], None] | None = None,
                 on_retrying: Callable[[Upload, str], None] | None = None, keep: int = 0, concurrency: int = 4, backoff: Backoff = Backoff()) -> None:
        self.store = store
        self.directory = Path(directory)
        self.on_stored = on_stored
        self.on_skipped = on_skipped
        self.on_superseded = on_superseded or (lambda u: None)
        self.on_retrying = on_retrying or (lambda u, why: None)
        self.keep = keep
        self.concurrency = max(1, concurrency)
        self.backoff = backoff
        self.queue: list[Upload] = []
        self.in_flight: Upload | None = None
        self.retries = 0  # failed store calls of the upload in flight (the store unavailable meanwhile)
        self.last_error: str | None = None
        self.stored: list[int] = []  # steps stored, in order
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._pool: ThreadPoolExecutor | None = None  # its own threads, at a lower CPU priority (lower_priority)

    # -- what the agent asks ---------------------------------------------------------------------------------

    def submit(self, upload: Upload) -> None:
        self.queue, gone = supersede(self.queue, upload)
        for old in gone:
            log.info("job %s: checkpoint of step %d superseded by step %d before its upload", old.job_id, old.step,
                     max(u.step for u in self.queue))
            self.on_superseded(old)
        self._wake.set()
        if self._task is None:
            self._task = asyncio.create_task(self._work(), name=f"upload-{upload.job_id}")

    @property
    def behind(self) -> list[Upload]:
        """What is not stored yet: the upload in flight, then those queued."""
        return ([self.in_flight] if self.in_flight else []) + list(self.queue)

    async def drain(self, timeout: float) -> bool:
        """Wait until every reported checkpoint is stored (or skipped); False if ``timeout`` ran out first."""
        loop = asyncio.get_running_loop()
        until = loop.time() + timeout
        while self.behind:
            if loop.time() >= until:
                return False
            await asyncio.sleep(min(0.05, max(0.0, until - loop.time())))
        return True

    async def close(self) -> None:
        """Stop uploading (an upload cut midway never gets its manifest: it does not exist for a resume)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _thread(self, fn: Callable, *args: object) -> asyncio.Future:
        """``fn(*args)`` in one of the uploader's threads (each an object's upload, hash, manifest or listing at
        once, as ``asyncio.to_thread`` would, but below the training process's CPU priority)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(2 * self.concurrency + 2, thread_name_prefix="ckpt-upload",
                                            initializer=lower_priority)
        return asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))

    # -- the work --------------------------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            if not self.queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            upload = self.in_flight = self.queue.pop(0)
            self.retries, self.last_error = 0, None
            try:
                made = await self._upload(upload)
            except Skipped as why:
                log.warning("job %s: checkpoint of step %d not stored: %s", upload.job_id, upload.step, why)
                self.in_flight = None
                self.on_skipped(upload, why.name, why.reason)
                continue
            self.stored.append(upload.step)
            listed = await self._listing(upload)
            gone = manifest.prunable(manifest.stored(upload.job_id, [k for k, _ in listed]), (upload.step, upload.epoch),
                               self.keep) if listed is not None else []
            # Reported before the older ones are deleted: the queue's accepted checkpoint is never one retention
            # already took; what the job holds is said as it will be once they are.
            self.on_stored(upload, made, None if listed is None else manifest.held_after(upload.job_id, listed, gone))
            # Behind until reported (not when its manifest is stored: the listing above awaits): a drain that
            # ends a run must not report its end before its last checkpoint.
            self.in_flight = None
            if gone:
                await self._retain(upload, [k for k, _ in listed], gone)

    async def _retry(self, what: str, call: Callable[[], object]) -> object:
        """``call`` in a worker thread, again after a back-off for as long as the store is unavailable; a refusal
        skips the checkpoint."""
        n = 0
        while True:
            try:
                return await self._thread(call)
            except StoreRefused as exc:
                raise Skipped(what, f"the store refused it: {exc.reason}") from exc
            except StoreError as exc:
                self.retries += 1
                self.last_error = f"{what}: {exc.reason}"
                if self.retries == 1 and self.in_flight is not None:  # said once an upload: the job shows it
                    self.on_retrying(self.in_flight, f"checkpoint store unavailable: {self.last_error}")
                delay = self.backoff.delay(n)
                n += 1
                log.info("checkpoint store unavailable (%s); retrying in %.1fs", self.last_error, delay)
                await asyncio.sleep(delay)

    async def _upload(self, upload: Upload) -> manifest.Manifest:
        try:
            rels = await self._thread(files.members, self.directory, upload.rel)
        except (files.NotACheckpoint, OSError) as exc:
            raise Skipped(upload.rel, str(exc)) from exc
        limit = asyncio.Semaphore(self.concurrency)

        async def one(rel: str) -> manifest.Entry:
            async with limit:
                return await self._object(upload, rel)

        entries = await asyncio.gather(*(one(rel) for rel in rels))
        if upload.sha256 is not None and len(entries) and rels[0] == upload.rel and \
                entries[0].sha256 != upload.sha256.lower():
            raise Skipped(upload.rel, f"changed since it was reported: sha256 {entries[0].sha256[:12]}..., "
                                      f"reported {upload.sha256[:12]}...")
        made = manifest.Manifest(job_id=upload.job_id, step=upload.step, epoch=upload.epoch, path=upload.rel,
                           sha256=upload.sha256, objects=tuple(entries), written_at=upload.written_at,
                           stored_at="", parent=upload.parent)
        made = replace(made, stored_at=datetime.now(UTC).isoformat())
        key = manifest.manifest_key(upload.job_id, upload.step, upload.epoch)
        await self._retry(key, lambda: self.store.put_bytes(key, made.to_bytes()))  # last: the commit point
        return made

    async def _object(self, upload: Upload, rel: str) -> manifest.Entry:
        key = manifest.object_key(upload.job_id, upload.epoch, upload.step, rel)
        path = self.directory / rel
        try:
            fd = await self._thread(files.open_regular, path)
        except (files.NotACheckpoint, OSError) as exc:
            raise Skipped(rel, f"cannot be read: {exc}") from exc
        try:
            # Hashed and uploaded at once, both from the inode just opened (the upload through /proc/self/fd, its
            # own file description, so neither moves the other's offset; never a path the run could have swapped
            # meanwhile): the hash costs no time of its own. The run's files are immutable once named.
            source = Path(f"/proc/self/fd/{fd}") if os.path.exists(f"/proc/self/fd/{fd}") else path
            hashing = asyncio.ensure_future(self._thread(files.sha256_fd, fd))
            try:
                await self._retry(key, lambda: self.store.put_file(key, source))
            finally:
                # The descriptor stays open until the hash is done with it (a cancelled upload waits for it too).
                done = await asyncio.gather(asyncio.shield(hashing), return_exceptions=True)
            if isinstance(done[0], BaseException):
                raise Skipped(rel, f"cannot be read: {done[0]}")
            sha, size = done[0]
        finally:
            os.close(fd)
        return manifest.Entry(path=rel, key=key, bytes=size, sha256=sha)

    async def _listing(self, upload: Upload) -> list[tuple[str, int]] | None:
        """The job's objects (key, size) in the store; None when it cannot be listed now (retention waits)."""
        try:
            return [(o.key, o.bytes) for o in await self._thread(self.store.list, manifest.job_prefix(upload.job_id))]
        except StoreError as exc:
            log.info("job %s: the store's objects not listed: %s", upload.job_id, exc)
            return None

    async def _retain(self, upload: Upload, keys: list[str], gone: list[tuple[int, int]]) -> None:
        """The store's retention once a newer checkpoint is stored: the manifest of each deleted checkpoint goes
        before its objects (half deleted, it no longer exists). Failures wait for the next stored checkpoint."""
        try:
            for step, epoch in gone:
                prefix = manifest.object_key(upload.job_id, epoch, step, "")
                await self._thread(self.store.delete, [manifest.manifest_key(upload.job_id, step, epoch)])
                await self._thread(self.store.delete, [k for k in keys if k.startswith(prefix)])
        except StoreError as exc:
            log.info("job %s: older checkpoints not deleted from the store yet: %s", upload.job_id, exc)
