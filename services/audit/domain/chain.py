"""The audit log's hash chain: each row's hash is sha256(previous hash || canonical JSON of its fields).

Changing, removing or reordering any row breaks the chain at that row or the next, and ``verify`` names the
first row that does not match. Canonical JSON: keys sorted, no whitespace, UTF-8, times in UTC with
microseconds (what PostgreSQL keeps), so a row read back from the database hashes as it did when written.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

GENESIS = "0" * 64  # the "previous hash" of the first row
HASHED_FIELDS = ("seq", "command_id", "actor", "time", "recorded_at", "subject", "kind", "job_id", "payload",
                 "outcome", "reason")


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC).isoformat(timespec="microseconds")
    return value


def canonical(fields: Mapping[str, Any]) -> bytes:
    body = {name: _plain(fields.get(name)) for name in HASHED_FIELDS}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def row_hash(prev_hash: str, fields: Mapping[str, Any]) -> str:
    return hashlib.sha256(prev_hash.encode() + canonical(fields)).hexdigest()


@dataclass(frozen=True)
class ChainCheck:
    first_bad_seq: int | None  # None: every row checked matches
    reason: str | None
    last_hash: str  # the hash to continue from (the last good row's)
    checked: int


def check_chain(rows: Iterable[Mapping[str, Any]], prev_hash: str = GENESIS) -> ChainCheck:
    """Check rows in ``seq`` order, continuing from ``prev_hash``; stops at the first row that does not match."""
    checked = 0
    for row in rows:
        checked += 1
        if row["prev_hash"] != prev_hash:
            return ChainCheck(row["seq"], "prev_hash does not match the previous row's hash (a row was removed, "
                              "inserted or changed before it)", prev_hash, checked)
        if row["hash"] != row_hash(prev_hash, row):
            return ChainCheck(row["seq"], "hash does not match the row's contents (the row was changed)",
                              prev_hash, checked)
        prev_hash = row["hash"]
    return ChainCheck(None, None, prev_hash, checked)


def verify(rows: Iterable[Mapping[str, Any]]) -> int | None:
    """The seq of the first row that breaks the chain, or None when the whole chain holds."""
    return check_chain(rows).first_bad_seq


def chain(entries: Iterable[Mapping[str, Any]], prev_hash: str = GENESIS) -> list[dict[str, Any]]:
    """Link new entries (each with its ``seq``) after ``prev_hash``: returns them with prev_hash and hash."""
    linked = []
    for entry in entries:
        digest = row_hash(prev_hash, entry)
        linked.append({**entry, "prev_hash": prev_hash, "hash": digest})
        prev_hash = digest
    return linked
