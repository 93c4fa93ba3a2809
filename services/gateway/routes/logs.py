"""A job's output: ``GET /v1/jobs/{id}/logs`` (pages by stream sequence, or ``follow`` as NDJSON until the job
ends) and the ``log_tail`` of a failed job's view. Readable by the job's owner and by ``read:all``, as the job
itself (scoping.py): anyone else gets the same 404 as for a job that does not exist."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.responses import StreamingResponse

from libs.contracts.bounds import INT32_MAX, MAX_SAFE_INT
from libs.contracts.logs import LogStream

from ..auth import Permission, Principal, require
from ..domain import logviews
from ..errors import unavailable
from ..logs import JobLogs
from ..logs import Query as LogQuery
from . import existing_job, reads_of

log = logging.getLogger(__name__)


def _logs(request: Request) -> JobLogs:
    logs = getattr(request.app.state, "job_logs", None)
    if logs is None:
        raise unavailable()
    return logs


async def log_tail(request: Request, job: dict[str, Any]) -> dict[str, Any] | None:
    """The last lines of a failed job's last attempt (None for any other job, or when none were shipped)."""
    logs = getattr(request.app.state, "job_logs", None)
    attempt = job.get("attempt_number")
    if logs is None or job.get("state") != "failed" or not attempt:
        return None
    spec = job.get("spec") if isinstance(job.get("spec"), dict) else {}
    ranks = len(job.get("gang") or []) or int(spec.get("workers") or 1)
    try:
        granted = await reads_of(request).job_grants(job["id"])
        return await logs.tail(job["id"], int(attempt), ranks, granted)
    except Exception as exc:  # noqa: BLE001 - the bus away: the job's view without its tail, not an error
        log.warning("log tail of job %s unavailable: %r", job.get("id"), exc)
        return None


def register(app: FastAPI) -> None:

    @app.get("/v1/jobs/{job_id}/logs", tags=["jobs"],
             summary="A job's output (stdout/stderr of every rank and attempt), paged by seq, or followed",
             description="Without `follow`: `{job_id, state, chunks: [...], next_after_seq, more}`; pass "
                         "`next_after_seq` back as `after_seq` for the next page. With `follow=true`: NDJSON, one "
                         "object per line: `{type: chunk, ...}` as output arrives, `{type: keepalive}` when idle, "
                         "and a last `{type: end, state, next_after_seq}` once the job has ended.")
    async def job_logs(request: Request, job_id: str,
                       after_seq: int = Query(0, ge=0, le=MAX_SAFE_INT, description="Chunks after this sequence"),
                       limit: int = Query(200, ge=1, le=1000, description="Chunks per page"),
                       attempt: int | None = Query(None, ge=1, le=INT32_MAX),
                       rank: int | None = Query(None, ge=0, le=INT32_MAX),
                       stream: LogStream | None = Query(None, description="stdout or stderr (default: both)"),
                       follow: bool = Query(False, description="Stream until the job ends (NDJSON)"),
                       principal: Principal = Depends(require(Permission.READ))) -> Any:
        job = await existing_job(request, job_id, principal)
        logs, reads = _logs(request), reads_of(request)
        q = LogQuery(job_id, attempt, rank, stream.value if stream else None)
        if follow:
            async def state() -> str | None:
                row = await reads.job_row(job_id)
                return row and row.get("state")

            async def lines():
                async for item in logs.follow(q, lambda: reads.job_grants(job_id), state, after_seq=after_seq,
                                              clock=time.monotonic):
                    yield json.dumps(item) + "\n"

            return StreamingResponse(lines(), media_type="application/x-ndjson",
                                     headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        page = await logs.page(q, await reads.job_grants(job_id), after_seq=after_seq, limit=limit)
        return {"job_id": job_id, "state": job.get("state"),
                "chunks": [logviews.chunk_view(seq, chunk) for seq, chunk in page.chunks],
                "next_after_seq": page.cursor, "more": page.full}
