"""One run's output on its way to the bus (I/O): fed by the pipe readers, sent by a task of its own.

``write`` is called by the readers with what the process wrote: it only cuts and queues (logship.py), so the
process is never held up by the bus; a slow or absent server costs pieces (dropped, and the gap is marked on the
next one), never the training. ``close`` ships what is left and the final piece (exit status and last lines),
waiting a bounded time, before the agent reports the run finished: a reader that follows the job sees all of it
before the job ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from nats.js import JetStreamContext

from libs.contracts.agents import RunJob
from libs.contracts.logs import LogChunk, LogStream, TailLine
from libs.contracts.subjects import Subjects
from libs.runtime import bus

from .logship import Backlog, Chunker, LogLimits, Piece

log = logging.getLogger(__name__)

SEND_TRIES = 3  # a piece the bus keeps refusing is dropped after this many tries (its gap shows on the next)


class RunLog:
    def __init__(self, js: JetStreamContext, subjects: Subjects, grant: RunJob, executor_id: str,
                 limits: LogLimits, *, send_timeout: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.js = js
        self.grant = grant
        self.executor_id = executor_id
        self.subject = subjects.logs(grant.job_id, grant.attempt, grant.rank, executor_id)
        self.limits = limits
        self.send_timeout = send_timeout
        self.clock = clock
        self.chunker = Chunker(limits)
        self.backlog = Backlog(limits.buffer_bytes)
        self.sent = 0  # pieces the server acknowledged
        self.lost = 0  # pieces dropped after SEND_TRIES
        self._wake = asyncio.Event()
        self._warned = False
        self._task = asyncio.create_task(self._run(), name=f"logs-{grant.job_id}-{grant.rank}")

    def write(self, stream: LogStream, data: bytes) -> None:
        """What the process wrote (called by the pipe readers; never waits)."""
        self._queue(self.chunker.feed(stream, data, self.clock()))

    def _queue(self, pieces: list[Piece]) -> None:
        for piece in pieces:
            if not self.backlog.push(piece) and not self._warned:
                self._warned = True  # once per run: the gaps themselves are marked in the chunks
                log.warning("job %s: log backlog full (%d bytes): dropping output until the bus catches up",
                            self.grant.job_id, self.limits.buffer_bytes)
        if pieces:
            self._wake.set()

    async def close(self, exit_code: int | None, timeout: float) -> bool:
        """Ship what is pending and the final piece; True when all of it reached the server within ``timeout``."""
        self._queue(self.chunker.close(exit_code))
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
            return True
        except TimeoutError:
            log.warning("job %s: %d log pieces not shipped within %.1fs of the run's end", self.grant.job_id,
                        len(self.backlog), timeout)
            return False
        finally:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.limits.flush_seconds / 2)
            self._wake.clear()
            self._queue(self.chunker.due(self.clock()))
            while (piece := self.backlog.pop()) is not None:
                await self._send(piece)
            if self.chunker.closed and not len(self.backlog):
                return

    async def _send(self, piece: Piece) -> None:
        try:
            msg = self.chunk(piece)
        except ValueError as exc:  # cannot happen with the limits the settings allow; never stops the shipping
            self.lost += 1
            log.error("job %s: log piece refused by its contract: %s", self.grant.job_id, exc)
            return
        tries = 0
        while True:
            try:
                await bus.publish(self.js, self.subject, msg, timeout=self.send_timeout)
            except Exception as exc:  # noqa: BLE001 - the bus is away or refuses: retry, then drop
                tries += 1
                if tries >= SEND_TRIES and not piece.final:  # the final piece is tried until close() gives up
                    self.lost += 1
                    log.warning("job %s: dropping a log piece of %d bytes: %r", self.grant.job_id, piece.nbytes, exc)
                    return
                await asyncio.sleep(min(1.0, self.limits.flush_seconds))
                continue
            self.backlog.delivered(piece)
            self.sent += 1
            return

    def chunk(self, piece: Piece) -> LogChunk:
        g = self.grant
        return LogChunk(job_id=g.job_id, epoch=g.epoch, attempt=g.attempt, rank=g.rank,
                        executor_id=self.executor_id, stream=piece.stream, offset=piece.offset, text=piece.text,
                        dropped_bytes=piece.dropped_bytes, truncated=piece.truncated, final=piece.final,
                        exit_code=piece.exit_code, tail=[TailLine(stream=s, text=t) for s, t in piece.tail])
