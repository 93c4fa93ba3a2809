"""A job's output as the gateway reads it: the LOGS stream (``teto.logs.<job>.<attempt>.<rank>.<executor>``),
read one message at a time by stream sequence (the stream is the store; nothing is consumed), filtered to the
chunks that belong to the job (domain/logviews.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nats.js.errors import NotFoundError

from libs.contracts.envelope import ContractError
from libs.contracts.logs import LogChunk
from libs.runtime.service import Runtime

from .domain import logviews

FOLLOW_POLL_SECONDS = 0.5
STATE_POLL_SECONDS = 1.0
END_GRACE_SECONDS = 1.0  # after the job ended, other ranks' last chunks may still be on their way
KEEPALIVE_SECONDS = 15.0
SCAN_LIMIT = 10_000  # messages looked at per page at most (skipped ones included), so a page always ends


@dataclass(frozen=True)
class Page:
    chunks: list[tuple[int, LogChunk]]
    cursor: int  # the last sequence looked at: the next page starts after it
    full: bool  # the page stopped at its limit (more may follow now)


@dataclass(frozen=True)
class Query:
    job_id: str
    attempt: int | None = None
    rank: int | None = None
    stream: str | None = None


class JobLogs:
    def __init__(self, runtime: Runtime) -> None:
        self.js = runtime.js
        self.subjects = runtime.subjects
        self.stream = runtime.subjects.stream_name("LOGS")

    async def page(self, q: Query, granted: logviews.Grants, *, after_seq: int, limit: int) -> Page:
        subject = self.subjects.logs_of(q.job_id, q.attempt, q.rank)
        found: list[tuple[int, LogChunk]] = []
        cursor = after_seq
        for _ in range(SCAN_LIMIT):
            if len(found) >= limit:
                return Page(found, cursor, True)
            try:
                raw = await self.js.get_msg(self.stream, seq=cursor + 1, subject=subject, next=True)
            except NotFoundError:
                break
            cursor = raw.seq
            chunk = _decode(raw.data)
            if chunk is not None and logviews.belongs(chunk, raw.subject, q.job_id, granted) \
                    and logviews.wanted(chunk, stream=q.stream):
                found.append((raw.seq, chunk))
        else:
            return Page(found, cursor, True)
        return Page(found, cursor, False)

    async def last(self, job_id: str, attempt: int, rank: int, granted: logviews.Grants) -> LogChunk | None:
        """The last chunk a rank of an attempt shipped (its final one when it arrived), from the executor granted it."""
        executor_id = granted.get((attempt, rank))
        if executor_id is None:
            return None
        try:
            raw = await self.js.get_msg(self.stream, subject=self.subjects.logs(job_id, attempt, rank, executor_id))
        except NotFoundError:
            return None
        chunk = _decode(raw.data)
        return chunk if chunk is not None and logviews.belongs(chunk, raw.subject, job_id, granted) else None

    async def tail(self, job_id: str, attempt: int, ranks: int, granted: logviews.Grants) -> dict[str, Any] | None:
        last = [await self.last(job_id, attempt, r, granted) for r in range(max(1, ranks))]
        return logviews.tail_view(c for c in last if c is not None)

    async def follow(self, q: Query, grants: Callable[[], Awaitable[logviews.Grants]],
                     state: Callable[[], Awaitable[str | None]], *, after_seq: int,
                     clock: Callable[[], float]) -> AsyncIterator[dict[str, Any]]:
        """Chunk views (``type: chunk``) as they arrive, a keep-alive line when idle, and one ``type: end`` line
        once the job has ended and what its runs shipped has been read."""
        cursor = after_seq
        last_state_check = last_line = clock()
        job_state = await state()
        ended_at = last_state_check if job_state is None or job_state in logviews.FOLLOW_END_STATES else None
        while True:
            # The grants are read again before each page: a chunk of an attempt granted since must not be skipped.
            page = await self.page(q, await grants(), after_seq=cursor, limit=500)
            cursor = page.cursor
            for seq, chunk in page.chunks:
                yield {"type": "chunk", **logviews.chunk_view(seq, chunk)}
                last_line = clock()
            if page.full:
                continue
            now = clock()
            if ended_at is not None and now - ended_at >= END_GRACE_SECONDS:
                yield {"type": "end", "state": job_state, "next_after_seq": cursor}
                return
            if ended_at is None and now - last_state_check >= STATE_POLL_SECONDS:
                last_state_check = now
                job_state = await state()
                if job_state is None or job_state in logviews.FOLLOW_END_STATES:
                    ended_at = now
                    continue
            if now - last_line >= KEEPALIVE_SECONDS:
                last_line = now
                yield {"type": "keepalive", "next_after_seq": cursor}
            await asyncio.sleep(FOLLOW_POLL_SECONDS)


def _decode(data: bytes | None) -> LogChunk | None:
    try:
        return LogChunk.decode(data or b"")
    except ContractError:
        return None  # not a chunk: nobody's output
