"""The audit log's hash chain: each row's hash is sha256(previous hash || canonical JSON of its fields).

Changing, removing or reordering any row breaks the chain at that row or the next, and ``verify`` names the
first row that does not match. Canonical JSON: keys sorted, no whitespace, UTF-8, times in UTC with
microseconds (what PostgreSQL keeps), so a row read back from the database hashes as it did when written.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from json.encoder import encode_basestring
from typing import Any

from .jsonb import canonical_text

GENESIS = "0" * 64  # the "previous hash" of the first row
HASHED_FIELDS = ("seq", "command_id", "actor", "time", "recorded_at", "subject", "kind", "job_id", "payload",
                 "outcome", "reason")


# Equal datetimes give the same text (a naive one is never equal to an aware one); a batch's rows share one
# recorded_at, so most of a batch's times are formatted once.
@lru_cache(maxsize=256)
def utc_text(value: datetime) -> str:
    """A time as the canonical text writes it: UTC with microseconds (a naive time taken as UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def _plain(value: Any) -> Any:
    return utc_text(value) if isinstance(value, datetime) else value


# The canonical text is ``json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
# allow_nan=False)`` of the hashed fields (times as above), written field by field into one template in sorted
# order: strings, ints and None directly, anything else (the payload) by the encoder. A writer that already has
# the payload's canonical text (it stores that very text) passes it, so the payload is not encoded twice.
_SORTED = tuple(sorted(HASHED_FIELDS))
_TEMPLATE = "{" + ",".join(f'"{name}":%s' for name in _SORTED) + "}"
_string = encode_basestring  # a JSON string literal, non-ASCII kept (the encoder's own, in C)


def _value(value: Any) -> str:
    kind = type(value)
    if value is None:
        return "null"
    if kind is str:
        return _string(value)
    if kind is int:
        return int.__repr__(value)
    if kind is datetime:
        return _string(utc_text(value))
    return canonical_text(_plain(value))


def _text_of(value: Any) -> str:
    """``_value``, a string or None first (most fields of every row)."""
    if type(value) is str:
        return _string(value)
    if value is None:
        return "null"
    return _value(value)


assert _SORTED == ("actor", "command_id", "job_id", "kind", "outcome", "payload", "reason", "recorded_at", "seq",
                   "subject", "time")


def canonical(fields: Mapping[str, Any], payload_text: str | None = None) -> bytes:
    """The row's canonical JSON; ``payload_text``, when given, is ``canonical_text(fields["payload"])``. A time
    may be given as its text (``utc_text`` of it), as the store gives a batch's shared ``recorded_at``.

    The template filled field by field in sorted order, each as ``_value`` writes it (spelled out: 2.2 us a row,
    where a loop over the names took 3.9 and orjson with the payload spliced in 4.0, most of it sorting keys)."""
    get = fields.get
    seq = get("seq")
    return (_TEMPLATE % (
        _text_of(get("actor")), _text_of(get("command_id")), _text_of(get("job_id")), _text_of(get("kind")),
        _text_of(get("outcome")), payload_text if payload_text is not None else _value(get("payload")),
        _text_of(get("reason")), _text_of(get("recorded_at")), int.__repr__(seq) if type(seq) is int else _value(seq),
        _text_of(get("subject")), _text_of(get("time")))).encode()


def row_hash(prev_hash: str, fields: Mapping[str, Any], payload_text: str | None = None) -> str:
    return hashlib.sha256(prev_hash.encode() + canonical(fields, payload_text)).hexdigest()


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


def chain(entries: Iterable[Mapping[str, Any]], prev_hash: str = GENESIS,
          payload_texts: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Link new entries (each with its ``seq``) after ``prev_hash``: returns them with prev_hash and hash.
    ``payload_texts``, when given, are the entries' payloads' canonical texts, in order (not encoded again)."""
    linked = []
    texts = iter(payload_texts) if payload_texts is not None else None
    for entry in entries:
        digest = row_hash(prev_hash, entry, next(texts) if texts is not None else None)
        linked.append({**entry, "prev_hash": prev_hash, "hash": digest})
        prev_hash = digest
    return linked
