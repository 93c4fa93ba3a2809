"""Keyset paging of the job list: an opaque cursor names the last job of a page by (created_at, id), the
list's order (newest first, ties by id), so the next page starts right after it whatever was submitted or
finished meanwhile: every job present for the whole walk is reached exactly once, and no page costs an OFFSET
scan. Pure: the cursor is text in, a position out; a cursor that does not decode is refused naming itself."""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from libs.contracts.bounds import ID_PATTERN

_ID = re.compile(ID_PATTERN)
_VERSION = 1
MAX_CURSOR_CHARS = 512


class BadCursor(ValueError):
    """A cursor this gateway did not make (or one cut or edited); the client should start again without one."""


@dataclass(frozen=True)
class Position:
    """The last job of a page: the next page holds the jobs after it in the list's order."""

    created_at: datetime
    job_id: str


def encode_cursor(pos: Position) -> str:
    raw = json.dumps({"v": _VERSION, "t": pos.created_at.isoformat(), "i": pos.job_id}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(text: str) -> Position:
    if not text or len(text) > MAX_CURSOR_CHARS:
        raise BadCursor("not a cursor of this list (start again without one)")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        body: Any = json.loads(raw)
        if not isinstance(body, dict) or body.get("v") != _VERSION:
            raise ValueError("unknown version")
        created_at = datetime.fromisoformat(body["t"])
        job_id = body["i"]
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise BadCursor("not a cursor of this list (start again without one)") from None
    if created_at.tzinfo is None or not isinstance(job_id, str) or not _ID.match(job_id):
        raise BadCursor("not a cursor of this list (start again without one)")
    return Position(created_at, job_id)


def page(rows: list[dict[str, Any]], limit: int) -> tuple[list[dict[str, Any]], str | None]:
    """A page from ``limit + 1`` rows read in list order: the first ``limit``, and the cursor after the last of
    them when there is more (None: this was the last page)."""
    if len(rows) <= limit:
        return rows, None
    kept = rows[:limit]
    last = kept[-1]
    return kept, encode_cursor(Position(last["created_at"], last["id"]))

