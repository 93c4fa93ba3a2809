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

import orjson

from .jsonb import canonical_text

GENESIS = "0" * 64  # the "previous hash" of the first row
HASHED_FIELDS = ("seq", "command_id", "actor", "time", "recorded_at", "subject", "kind", "job_id", "payload",
                 "outcome", "reason")


# Equal datetimes give the same text (a naive one is never equal to an aware one); a batch's rows share one
# recorded_at, so most of a batch's times are formatted once.
@lru_cache(maxsize=256)
def _utc_text(value: datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat(timespec="microseconds")


def _plain(value: Any) -> Any:
    return _utc_text(value) if isinstance(value, datetime) else value


# The canonical text is ``json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
# allow_nan=False)`` of the hashed fields (times as above), written field by field into one template in sorted
# order: strings, ints and None directly, anything else (the payload) by the encoder. A writer that already has
# the payload's canonical text (it stores that very text) passes it, so the payload is not encoded twice.
_SORTED = tuple(sorted(HASHED_FIELDS))
_TEMPLATE = "{" + ",".join(f'"{name}":%s' for name in _SORTED) + "}"
_BEFORE_PAYLOAD = _SORTED[:_SORTED.index("payload")]
_AFTER_PAYLOAD = _SORTED[_SORTED.index("payload") + 1:]
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
        return _string(_utc_text(value))
    return canonical_text(_plain(value))


# With the payload's text at hand, the row is written by orjson, the payload spliced in as it is (a Fragment): for
# strings (escaped alike: tests/unit/test_audit_canonical.py), 64-bit ints, booleans and None it writes what the
# template writes. A field of any other type (a float, an enum, a list) takes the template; so does a string
# orjson refuses (a lone surrogate: the template's encode raises, as it always did).
_ORJSON_PLAIN = frozenset({str, int, bool, type(None)})
_HASHED = frozenset(HASHED_FIELDS)


def _compiled(fields: Mapping[str, Any], payload_text: str) -> bytes | None:
    body = dict(fields) if fields.keys() == _HASHED else {name: fields.get(name) for name in HASHED_FIELDS}
    when, recorded = body["time"], body["recorded_at"]
    if type(when) is datetime:
        body["time"] = _utc_text(when)
    if type(recorded) is datetime:
        body["recorded_at"] = _utc_text(recorded)
    body["payload"] = None  # checked apart: its text is given
    if not _ORJSON_PLAIN.issuperset(map(type, body.values())):
        return None
    body["payload"] = orjson.Fragment(payload_text)
    try:
        return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # orjson.JSONEncodeError: a lone surrogate, an int beyond 64 bits
        return None


def canonical(fields: Mapping[str, Any], payload_text: str | None = None) -> bytes:
    """The row's canonical JSON; ``payload_text``, when given, is ``canonical_text(fields["payload"])``."""
    if payload_text is not None and (found := _compiled(fields, payload_text)) is not None:
        return found
    get = fields.get
    payload = payload_text if payload_text is not None else _value(get("payload"))
    return (_TEMPLATE % (*[_value(get(name)) for name in _BEFORE_PAYLOAD], payload,
                         *[_value(get(name)) for name in _AFTER_PAYLOAD])).encode()


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
