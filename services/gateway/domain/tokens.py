"""API tokens and sign-in sessions as records: whether one still holds, when its last use is worth writing, and
how a record of the old tokens file becomes a row of ``gateway.tokens`` (the upgrade). Pure; the clock is an
argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

TOKEN_PREFIX = "teto_"  # an API token's secret
SESSION_PREFIX = "tetos_"  # a sign-in session's secret (the panel's cookie, or `teto login`'s credential)
TOUCH_EVERY = timedelta(seconds=60)  # last_used_at is written at most this often per token (a write per request
# would make every read a write)


class State(StrEnum):
    ACTIVE = "active"  # may be used
    REVOKED = "revoked"  # revoked by an admin (a token), or signed out (a session)
    EXPIRED = "expired"  # past its expiry


def state_of(*, revoked_at: datetime | None, expires_at: datetime | None, now: datetime) -> State:
    if revoked_at is not None:
        return State.REVOKED
    if expires_at is not None and expires_at <= now:
        return State.EXPIRED
    return State.ACTIVE


def touch_due(last_used_at: datetime | None, now: datetime) -> bool:
    return last_used_at is None or now - last_used_at >= TOUCH_EVERY


@dataclass(frozen=True)
class FileToken:
    """One record of a tokens file, as the database keeps it."""

    id: str
    sha256: str
    actor: str
    role: str
    org: str | None
    created_at: datetime
    revoked_at: datetime | None


def _when(value: Any, fallback: datetime) -> datetime:
    try:
        found = datetime.fromisoformat(str(value))
    except ValueError:
        return fallback
    return found if found.tzinfo else found.replace(tzinfo=UTC)


def from_file(raw: Mapping[str, Any], *, now: datetime) -> FileToken | None:
    """A tokens-file record (``{"id", "actor", "role", "sha256", "created_at", "revoked", "org"?}``) as a row;
    None for a record too broken to be a token (no id or hash, a NUL character). A revoked record is revoked as of its import
    (the file never said when); its role and actor are kept as written, checked when it is used."""
    token_id, digest = raw.get("id"), raw.get("sha256")
    if not isinstance(token_id, str) or not token_id or not isinstance(digest, str) or len(digest) != 64:
        return None
    org = raw.get("org")
    if any("\x00" in str(raw.get(k, "")) for k in ("id", "actor", "role", "org")):
        return None  # PostgreSQL text cannot hold NUL; such a record was never a usable token
    return FileToken(id=token_id, sha256=digest.lower(), actor=str(raw.get("actor", "")), role=str(raw.get("role", "")),
                     org=org if isinstance(org, str) else None, created_at=_when(raw.get("created_at"), now),
                     revoked_at=now if raw.get("revoked") else None)
