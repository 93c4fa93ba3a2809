"""What makes the audit log trustworthy against someone who can write its table: a mac on every row, and anchors.

The hash chain alone proves nothing to a database superuser: they can disable the trigger, change a row and
recompute every later hash, and the chain holds again. Two things they do not have close that:
- the **audit key**, held by the audit service alone: each row carries ``mac = HMAC-SHA256(key, row hash)``, so a
  row whose hash was recomputed without the key carries a mac that does not match;
- the **anchors**: the chain head (seq, hash) published to a JetStream stream that refuses deletes and purges.
  A rewritten row at or before an anchored seq changes the anchored row's hash (the chain carries every earlier
  row into it); a table shorter than the newest anchor was truncated.
Rows written before the key existed carry no mac ("pre-key"): only the anchors protect them. Once a row carries a
mac every later one must (an attacker stripping macs would otherwise turn rewritten rows into "pre-key" ones),
and the anchors say from which seq macs began (``keyed_from``), so stripping them all is seen too.

Everything here is pure: no database, no bus, no clock.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

ROW_DOMAIN = b"teto.audit.row/1:"  # distinct prefixes: a row mac can never pass for an anchor mac
ANCHOR_DOMAIN = b"teto.audit.anchor/1:"
ANCHORED_FIELDS = ("seq", "hash", "rows", "recorded_at", "keyed_from")
MIN_KEY_BYTES = 32


def row_mac(key: bytes, row_hash: str) -> str:
    return hmac.digest(key, ROW_DOMAIN + row_hash.encode(), "sha256").hex()  # one call, per row on the write path


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat(timespec="microseconds")
    return value


def anchor_mac(key: bytes, anchor: Mapping[str, Any]) -> str:
    body = json.dumps({k: _plain(anchor.get(k)) for k in ANCHORED_FIELDS}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, ANCHOR_DOMAIN + body.encode(), hashlib.sha256).hexdigest()


def same(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and hmac.compare_digest(a, b)


@dataclass(frozen=True)
class MacCheck:
    first_bad_seq: int | None  # None: every row's mac holds
    reason: str | None
    checked: int  # macs verified
    pre_key: int  # rows without a mac, accepted as written before the key existed
    keyed_from: int | None  # from this seq on every row must carry a mac (carried to the next page)


def check_macs(rows: Iterable[Mapping[str, Any]], key: bytes, *, keyed_from: int | None = None) -> MacCheck:
    """Check each row's mac in seq order; ``keyed_from`` (from the anchors or an earlier page) marks where macs
    are mandatory. Stops at the first bad row."""
    checked = pre_key = 0
    for row in rows:
        seq, mac = row["seq"], row.get("mac")
        if mac is None:
            if keyed_from is not None and seq >= keyed_from:
                return MacCheck(seq, f"mac missing: rows carry macs from seq {keyed_from} on (the row was "
                                "rewritten or inserted by someone without the audit key)", checked, pre_key, keyed_from)
            pre_key += 1
            continue
        if keyed_from is None:
            keyed_from = seq
        if not same(mac, row_mac(key, row["hash"])):
            return MacCheck(seq, "mac does not match the row's hash (the row was rewritten, its hash recomputed, "
                            "by someone without the audit key)", checked, pre_key, keyed_from)
        checked += 1
    return MacCheck(None, None, checked, pre_key, keyed_from)


def worth_anchoring(head_seq: int | None, last_anchored: int) -> bool:
    """Anchor a head that moved forward. A head behind the last anchor means rows were removed: anchoring it would
    only add noise (the older anchor already names the truncation), so it is not anchored."""
    return head_seq is not None and head_seq > last_anchored


def make_anchor(head: Mapping[str, Any], key: bytes | None) -> dict[str, Any]:
    """The anchor fields for a chain head (seq, hash, rows, recorded_at, keyed_from), with its mac if keyed."""
    anchor = {k: head.get(k) for k in ANCHORED_FIELDS}
    anchor["mac"] = anchor_mac(key, anchor) if key is not None else None
    return anchor


@dataclass(frozen=True)
class AnchorCheck:
    first_bad_anchor: int | None  # stream sequence of the first anchor the table (or the key) disagrees with
    bad_seq: int | None  # the row it names (the first missing one for a truncation)
    reason: str | None
    checked: int
    unsigned: int  # anchors made without a key (compared, but anyone who could publish could have made them)
    malformed: int  # messages on the anchor subject that are no anchor at all: they claim nothing, so skipped
    last_seq: int | None
    last_time: datetime | None
    keyed_from: int | None  # the earliest seq from which the (authentic) anchors say rows carry macs


def check_anchors(anchors: Sequence[Mapping[str, Any]], stored: Mapping[int, str], head_seq: int | None,
                  key: bytes | None, *, first_stream_seq: int = 1) -> AnchorCheck:
    """Compare the anchors (in stream order, each with ``stream_seq`` and ``time``) with the table.

    ``stored`` maps each anchored seq still in the table to its hash; ``head_seq`` is the table's newest seq.
    Rules, in order, per anchor: the anchors form an unbroken run of stream sequences from ``first_stream_seq``
    (anchors cannot be deleted, so a gap or a later start means the stream was tampered with); a message marked
    ``malformed`` (not an anchor at all) is counted and skipped, since it claims nothing; a mac, where
    there is one, is the key's; the anchored seq is not past the table's end (else: truncated); the row exists
    and has the anchored hash (else: rewritten at or before that seq).
    """
    checked = unsigned = malformed = 0
    last_seq: int | None = None
    last_time: datetime | None = None
    keyed_from: int | None = None
    expected = first_stream_seq

    def bad(anchor: Mapping[str, Any], seq: int | None, reason: str) -> AnchorCheck:
        return AnchorCheck(anchor["stream_seq"], seq, reason, checked, unsigned, malformed, last_seq, last_time,
                           keyed_from)

    for anchor in anchors:
        if anchor["stream_seq"] != expected:
            return bad(anchor, None, f"anchor stream sequence {anchor['stream_seq']} where {expected} was expected:"
                       " anchors were removed from the stream")
        expected += 1
        if anchor.get("malformed"):  # someone published junk where only the audit service should: it says nothing
            malformed += 1
            continue
        seq, when = anchor["seq"], anchor.get("time")
        if anchor.get("mac") is None:
            unsigned += 1
        elif key is not None and not same(anchor["mac"], anchor_mac(key, anchor)):
            return bad(anchor, None, "anchor not made with the audit key (forged, or the key was changed)")
        if head_seq is None or seq > head_seq:
            end = f"ends at seq {head_seq}" if head_seq is not None else "is empty"
            return bad(anchor, (head_seq or 0) + 1, f"truncated: the log {end} but the anchor of {_when(when)} "
                       f"saw seq {seq}: rows were removed")
        if seq not in stored:
            return bad(anchor, seq, f"row {seq}, anchored at {_when(when)}, is missing: rows were removed")
        if not same(stored[seq], anchor["hash"]):
            return bad(anchor, seq, f"row {seq} differs from its anchor of {_when(when)}: the log was rewritten at "
                       f"or before seq {seq} (hashes recomputed)")
        if anchor.get("keyed_from") is not None and (anchor.get("mac") is not None or key is None):
            keyed_from = anchor["keyed_from"] if keyed_from is None else min(keyed_from, anchor["keyed_from"])
        checked += 1
        last_seq, last_time = seq, when
    return AnchorCheck(None, None, None, checked, unsigned, malformed, last_seq, last_time, keyed_from)


def verdict(row_bad_seq: int | None, row_reason: str | None, anchors: AnchorCheck,
            weak_stream: Sequence[str] = ()) -> tuple[int | None, str | None]:
    """The one (first bad seq, reason) verify reports; (None, None) when all holds.

    The earliest row named wins, whether by the rows' own check (chain, mac) or by an anchor; an anchor failure
    that names no row (forged, or anchors missing from the stream) is the reason only when every row holds; a
    weakened anchor stream is the reason only when nothing else failed (its anchors may already be gone)."""
    anchor_first = anchors.bad_seq is not None and (row_bad_seq is None or anchors.bad_seq < row_bad_seq)
    if anchors.reason is not None and (anchor_first or row_bad_seq is None):
        return anchors.bad_seq, anchors.reason
    if row_reason is not None:
        return row_bad_seq, row_reason
    if weak_stream:
        return None, "the anchor stream's configuration was weakened: " + ", ".join(weak_stream)
    return None, None


def _when(value: datetime | None) -> str:
    return value.astimezone(UTC).isoformat(timespec="seconds") if value is not None else "an unknown time"
