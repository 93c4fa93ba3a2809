"""The panel's reads beyond the API's: a page of jobs by filters (state, signal, owner, name) with a keyset
cursor that reaches every job, and a job's step history from the progress stream.

Only the public views are read (queue.jobs_public, health.job_signals_public), through the gateway's Reads, and
rows are decorated exactly as the API shows them (views.job_view). The cursor is the last row's
``(created_at, id)``: pages stay stable while new jobs arrive, and the N-th page costs what the first does.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from libs.runtime import tail

from .fmt import parse_time

TERMINAL_STATES = ("succeeded", "failed", "cancelled")
SIGNALS = ("stuck", "no_signal")
STEP_HISTORY_LIMIT = 5000


@dataclass(frozen=True)
class JobFilter:
    state: str | None = None
    signal: str | None = None  # stuck | no_signal
    owner: str | None = None
    name: str | None = None  # substring, case-insensitive


def encode_cursor(created_at: datetime | str, job_id: str) -> str:
    moment = created_at.isoformat() if isinstance(created_at, datetime) else str(created_at)
    return base64.urlsafe_b64encode(f"{moment}|{job_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> tuple[datetime, str] | None:
    """The ``(created_at, id)`` a cursor stands for; None for no cursor or one that is not ours."""
    if not cursor or len(cursor) > 400:
        return None
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None
    moment, sep, job_id = text.partition("|")
    created = parse_time(moment)
    if not sep or created is None or not job_id:
        return None
    return created, job_id


def like_pattern(text: str) -> str:
    """A substring pattern for ILIKE with the user's ``%``, ``_`` and ``\\`` taken literally."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


_PAGE_SQL = """
SELECT j.* FROM queue.jobs_public j
LEFT JOIN health.job_signals_public s ON s.job_id = j.id
WHERE ($1::text IS NULL OR j.state = $1)
  AND ($2::text IS NULL OR j.owner = $2)
  AND ($3::text IS NULL OR j.name ILIKE $3)
  AND ($4::text IS NULL OR (s.signal = $4 AND j.state <> ALL($5::text[])))
  AND ($6::timestamptz IS NULL OR (j.created_at, j.id) < ($6, $7))
ORDER BY j.created_at DESC, j.id DESC
LIMIT $8
"""


async def job_page(reads: Any, f: JobFilter, *, cursor: str | None, limit: int) -> tuple[list[dict], str | None]:
    """One page of jobs, newest first, and the cursor of the next page (None: this is the last)."""
    after = decode_cursor(cursor)
    rows = await reads._fetch(
        "queue.jobs_public", _PAGE_SQL, f.state, f.owner, like_pattern(f.name) if f.name else None, f.signal,
        list(TERMINAL_STATES), after[0] if after else None, after[1] if after else None, limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    jobs = await reads._decorate(rows)
    nxt = encode_cursor(rows[-1]["created_at"], rows[-1]["id"]) if more and rows else None
    return jobs, nxt


def step_point(body: dict[str, Any]) -> dict[str, Any] | None:
    """A step report as a point of the loss and step-time plots: ``{step, loss, step_seconds, time, epoch}``."""
    if body.get("kind") != "step" or body.get("step") is None:
        return None
    return {"step": body["step"], "loss": body.get("loss"), "step_seconds": body.get("step_seconds"),
            "time": body.get("time"), "epoch": body.get("epoch")}


async def step_history(runtime: Any, job_id: str, *, limit: int = STEP_HISTORY_LIMIT) -> list[dict[str, Any]]:
    """The job's step reports still in the progress stream (kept 7 days), oldest first, at most ``limit``."""
    subjects = runtime.subjects
    messages = await tail.replay(runtime.js, subjects.stream_name("PROGRESS"),
                                 subjects.progress_of(job_id), limit=limit)
    points = [step_point(body) for _, body in messages]
    return [p for p in points if p is not None]
