"""What the audit log records for each message: a command as received, a command's outcome, a message some
consumer refused. Anything that arrives is recorded, however malformed: the audit never drops a message it
was given; it records what it can read and keeps the rest as raw text.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from libs.contracts.bounds import ID_PATTERN
from libs.contracts.secrets import redact

from . import compiled, jsonb

_COMMAND_ID = re.compile(ID_PATTERN)  # the contracts' ids (an Idempotency-Key's derived id is 66 characters)
RAW_EXCERPT_CHARS = 4000


class Outcome(StrEnum):
    RECEIVED = "received"  # a command as it arrived on the command stream
    ACCEPTED = "accepted"  # its owner (or the gateway) accepted it
    REFUSED = "refused"  # refused, with the reason
    REJECTED = "rejected"  # a message a consumer refused as malformed or hostile


# Not frozen: a frozen dataclass sets each of its eleven fields through object.__setattr__, 1.7 us an entry against
# 0.5 (one entry per message the audit reads). Nothing changes an entry once made.
@dataclass(slots=True)
class Entry:
    command_id: str
    actor: str | None
    time: datetime
    subject: str
    kind: str | None
    job_id: str | None
    payload: Any
    outcome: Outcome
    reason: str | None
    # The payload is already as PostgreSQL's jsonb gives it back (parse_payload made it so): the store hashes and
    # stores it as it is instead of normalising it first (jsonb.normal).
    payload_normal: bool = False
    # With payload_normal: the payload's canonical text (jsonb.canonical_text), taken when the message was read
    # (the edge reads a batch while the one before is in the database), so the store does not encode it again.
    payload_text: str | None = None
    # ``time``'s canonical text (chain.utc_text of it) where the message wrote it in that form already but for
    # "Z" (``_time_and_text``): the chain hashes it instead of formatting the time again.
    time_text: str | None = None


_SURROGATE = re.compile("[\ud800-\udfff]")  # left alone by json.loads (a "\ud800" escape without its pair)


def clean(value: Any) -> Any:
    """What PostgreSQL can store: no NUL characters and no lone surrogates (text and jsonb refuse them, and
    neither can be written as UTF-8), no NaN or infinities."""
    if isinstance(value, str):
        value = value.replace("\x00", "\ufffd")
        return value if value.isascii() else _SURROGATE.sub("\ufffd", value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {clean(str(k)): clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


# A JSON text with none of these needs neither cleaning nor redaction: without \u escapes a NUL cannot be written
# (a raw control character is invalid JSON) and a secret's key can only be spelled out; NaN and the infinities
# are their own tokens; a NUL byte means UTF-16 or UTF-32, where the spelled-out markers would not match; a
# surrogate written raw (0xED 0xA0-0xBF, which json.loads lets through) starts with 0xED, as do some Hangul
# syllables, which only take the walk. The common case (every command the gateway publishes) skips two full
# walks of the payload.
_NEEDS_WALK = (b"\\u", b"NaN", b"Infinity", b"secret", b"sealed", b"\x00", b"\xed")


def parse_number(text: str) -> float | int | str:
    """A JSON number with a fraction or exponent, as the store will keep it: a float too large for a float
    (1e999) as text, as ``clean`` keeps an infinity; any other as jsonb gives it back (jsonb.stored_float)."""
    value = float(text)
    if 0 < abs(value) < 1e16:  # the usual number: its repr has no "e+", jsonb gives it back as it is
        return value
    return jsonb.stored_float(value) if math.isfinite(value) else str(value)


def _plain_json(data: bytes) -> bool:
    return not any(marker in data for marker in _NEEDS_WALK)


# json.loads(data, parse_float=...) builds this decoder and sniffs the encoding on every call. A JSON object with
# none of the markers above starts with "{" and has no NUL byte, so it is UTF-8 without a byte-order mark, which
# is what json.loads would decode it as; invalid UTF-8 raises the ValueError json.loads raises.
_DECODE = json.JSONDecoder(parse_float=parse_number).decode


def _loads(data: bytes) -> Any:
    if data[:1] == b"{":
        return _DECODE(data.decode("utf-8"))
    return json.loads(data, parse_float=parse_number)


def parse_payload_json(data: bytes) -> tuple[Any, bool]:
    """(JSON value, True), or ({"raw": excerpt, "bytes": n}, False) for something that is not JSON. Secret env
    values (sealed by the gateway) are recorded as redacted: the log shows that a value was given, not it. Either
    way the value is as PostgreSQL's jsonb will give it back (``Entry.payload_normal``). The definition, in the
    standard library; ``read_payload`` takes a compiled path where it gives the same."""
    try:
        if _plain_json(data):
            # A number too large for a float (1e999) parses to infinity without any marker: kept as text, as
            # ``clean`` keeps it.
            return _loads(data), True
        return redact(clean(json.loads(data, parse_float=parse_number))), True
    except (ValueError, RecursionError):
        excerpt = clean(data[:RAW_EXCERPT_CHARS].decode("utf-8", "replace"))
        return {"raw": redact(excerpt), "bytes": len(data)}, False


# What a text needs for the compiled path: no escape (it could spell a NUL, or a secret's key) and no secret's key
# spelled out (both need the walks of the definition). Whatever else the definition cleans, orjson refuses.
_NEEDS_DEFINITION = (b"\\u", b"secret", b"sealed")


def _read(data: bytes) -> tuple[Any, bool, str | None, bool]:
    """``read_payload``, and whether every string in the value is known to need no ``clean``: orjson refuses a raw
    control character (a NUL can only be written as an escape, which the compiled path never sees), invalid UTF-8
    and a lone surrogate, so the strings of a value it parsed are already what ``clean`` would make of them."""
    # _NEEDS_DEFINITION spelled out; a backslash (rare) is looked for before the escape.
    if not ((b"\\" in data and b"\\u" in data) or b"secret" in data or b"sealed" in data):
        found = compiled.parse_canonical(data)
        if found is not None:
            return found[0], True, found[1], True
    payload, ok = parse_payload_json(data)
    return payload, ok, _encoded(payload), False


def read_payload(data: bytes) -> tuple[Any, bool, str | None]:
    """``parse_payload_json``'s (value, is JSON) and the value's canonical text (``_encoded``), the same values
    and bytes, by orjson where it provably gives them (services/audit/domain/compiled.py)."""
    payload, ok, text, _ = _read(data)
    return payload, ok, text


def parse_payload(data: bytes) -> tuple[Any, bool]:
    """(JSON value, True), or ({"raw": excerpt, "bytes": n}, False) for something that is not JSON: what
    ``parse_payload_json`` gives (``read_payload`` without the text)."""
    payload, ok, _ = read_payload(data)
    return payload, ok


def _as_is(value: str) -> str:
    return value


Tidy = Callable[[str], str]  # ``clean``, or ``_as_is`` for a value whose strings need no cleaning (``_read``)


def _text(payload: Any, key: str, limit: int = 1000, tidy: Tidy = clean) -> str | None:
    value = payload.get(key) if isinstance(payload, dict) else None
    return tidy(value)[:limit] if isinstance(value, str) else None


# A time in UTC with microseconds, as Teto's contracts write one ("Z") or as the canonical text does ("+00:00"):
# once parsed, its canonical text is these characters with "+00:00" for the zone.
_UTC_MICROS = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(?:Z|\+00:00)", re.ASCII)


def _time_and_text(payload: Any, key: str, fallback: datetime, tidy: Tidy = clean) -> tuple[datetime, str | None]:
    """The time the payload gives under ``key`` (``fallback`` when it gives none that parses), and its canonical
    text (``Entry.time_text``) where the text given is that but for the zone's spelling, else None."""
    raw = _text(payload, key, 64, tidy)
    try:
        parsed = datetime.fromisoformat(raw) if raw else None
    except ValueError:
        parsed = None
    if parsed is None:
        return fallback, None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC), None
    return parsed, raw[:26] + "+00:00" if _UTC_MICROS.fullmatch(raw) else None


def _time(payload: Any, key: str, fallback: datetime, tidy: Tidy = clean) -> datetime:
    return _time_and_text(payload, key, fallback, tidy)[0]


Fallback = str | Callable[[], str]  # a name, or how to make one (only asked for when it is needed)


def _named(fallback: Fallback) -> str:
    return fallback if isinstance(fallback, str) else fallback()


def _command_id(payload: Any, fallback: Fallback, tidy: Tidy = clean) -> str:
    value = _text(payload, "command_id", 200, tidy)
    return value if value and _COMMAND_ID.match(value) else _named(fallback)


def _last_token(subject: str) -> str:
    return subject.rsplit(".", 1)[-1]


def _encoded(payload: Any) -> str | None:
    """``Entry.payload_text``; None where the store must find out (and fail the batch) that it cannot be stored."""
    try:
        return jsonb.canonical_text(payload)
    except (TypeError, ValueError):
        return None


def from_command(subject: str, data: bytes, fallback_id: Fallback, now: datetime) -> Entry:
    """A command as received; ``fallback_id`` (stream and sequence, or how to find them) names one without a
    usable command id."""
    payload, _, text, cleaned = _read(data)
    tidy = _as_is if cleaned else clean
    subject = clean(subject)
    time, time_text = _time_and_text(payload, "issued_at", now, tidy)
    return Entry(command_id=_command_id(payload, fallback_id, tidy), actor=_text(payload, "actor", 200, tidy),
                 time=time, subject=subject, kind=_last_token(subject), job_id=_text(payload, "job_id", 200, tidy),
                 payload=payload, outcome=Outcome.RECEIVED, reason=None, payload_normal=True, payload_text=text,
                 time_text=time_text)


def from_outcome(subject: str, data: bytes, fallback_id: Fallback, now: datetime) -> Entry:
    """A command's outcome. The actor is the one the decider names (the gateway does, in ``detail.actor``);
    the store fills it from the command as received otherwise."""
    payload, ok, text, cleaned = _read(data)
    tidy = _as_is if cleaned else clean
    accepted = payload.get("accepted") if isinstance(payload, dict) else None
    detail = payload.get("detail") if isinstance(payload, dict) else None
    if not ok or not isinstance(accepted, bool):
        return Entry(command_id=_named(fallback_id), actor=None, time=now, subject=clean(subject), kind=None,
                     job_id=None, payload=payload, outcome=Outcome.REJECTED, reason="malformed outcome",
                     payload_normal=True, payload_text=text)
    time, time_text = _time_and_text(payload, "time", now, tidy)
    return Entry(command_id=_command_id(payload, fallback_id, tidy), actor=_text(detail, "actor", 200, tidy),
                 time=time, subject=clean(subject), kind=_text(payload, "kind", 100, tidy),
                 job_id=_text(payload, "job_id", 200, tidy), payload=payload,
                 outcome=Outcome.ACCEPTED if accepted else Outcome.REFUSED,
                 reason=_text(payload, "reason", 4000, tidy), payload_normal=True, payload_text=text,
                 time_text=time_text)


def from_rejected(subject: str, data: bytes, fallback_id: Fallback, now: datetime) -> Entry:
    """A message some consumer refused, as the ``teto.rejected.<service>`` note describes it."""
    note, _, text = read_payload(data)
    original_subject = _text(note, "subject", 1000) or clean(subject)
    excerpt, _ = parse_payload((_text(note, "payload_excerpt", RAW_EXCERPT_CHARS) or "").encode())
    return Entry(command_id=_text(note, "id", 100) or _named(fallback_id), actor=_text(excerpt, "actor", 200),
                 time=_time(note, "time", now), subject=original_subject, kind=_last_token(original_subject),
                 job_id=_text(excerpt, "job_id", 200), payload=note, outcome=Outcome.REJECTED,
                 reason=_text(note, "reason", 4000) or "refused", payload_normal=True, payload_text=text)
