"""The audit log (schema ``audit``): appending entries to the hash chain, and verifying it.

Writers serialize on a transaction-scoped advisory lock, so every replica extends one chain: under the lock a
batch reads the chain's head, drops entries already stored (redeliveries), draws sequence numbers, links the
new rows and inserts them, all in one transaction through the INSERT/SELECT-only writer role. The consumer
acknowledges the batch only after this commits.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from libs.runtime.db import lock_key
from libs.runtime.errors import PermanentError

from .domain import anchoring, chain, jsonb
from .domain.entries import Entry

log = logging.getLogger(__name__)

SCHEMA = "audit"
VERIFY_PAGE = 5000


async def writer_role(conn: asyncpg.Connection, configured: str | None) -> str | None:
    """The role to write as, or None (with a warning) when it does not exist or cannot be assumed."""
    role = configured or f"{await conn.fetchval('SELECT current_database()')}_audit_writer"
    usable = await conn.fetchval(
        "SELECT pg_has_role(current_user, oid, 'MEMBER') FROM pg_roles WHERE rolname = $1", role)
    if not usable:
        log.error("audit writer role %s missing or not assumable by %s: writing as the session user; the "
                  "append-only trigger still holds (see docs/operations.md)", role, await conn.fetchval(
                      "SELECT current_user"))
        return None
    return role


COLUMNS = ("seq", "command_id", "actor", "time", "recorded_at", "subject", "kind", "job_id", "payload", "outcome",
           "reason", "prev_hash", "hash", "mac")


def _dedupe(entries: Sequence[Entry]) -> list[Entry]:
    seen: set[tuple[str, str]] = set()
    out = []
    for e in entries:
        key = (e.command_id, str(e.outcome))
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


# Under the chain lock, one round trip: the chain's head, which of the batch's (command id, outcome) pairs are not
# stored yet (their positions in the batch), a sequence number for each of those, and the actor of each command
# as received for the outcomes that name none. ``fresh`` is materialised once (a CTE read twice), so the numbers
# drawn match it one for one; their order is fixed in Python (the chain takes them ascending).
_PLAN = """
WITH k AS (SELECT c, o, i FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(c, o, i)),
fresh AS (SELECT i FROM k WHERE NOT EXISTS (SELECT FROM audit.log l WHERE l.command_id = k.c AND l.outcome = k.o))
SELECT (SELECT hash FROM audit.log ORDER BY seq DESC LIMIT 1) AS head,
       (SELECT array_agg(i ORDER BY i) FROM fresh) AS fresh,
       (SELECT array_agg(nextval('audit.log_seq_seq')) FROM fresh) AS seqs,
       (SELECT array_agg(ARRAY[command_id, actor]) FROM audit.log
         WHERE command_id = ANY($3::text[]) AND outcome = 'received' AND actor IS NOT NULL) AS actors
"""


def _payloads(entries: Sequence[Entry]) -> list[tuple[object, str]]:
    """Each payload as PostgreSQL will give it back, and its canonical text (what is hashed and stored). A payload
    that cannot be stored (not JSON, a NaN) fails the batch as the database would: permanently, so the edge
    isolates it and dead-letters it alone."""
    try:
        return [(e.payload, e.payload_text if e.payload_text is not None else jsonb.canonical_text(e.payload))
                if e.payload_normal else jsonb.normal(e.payload) for e in entries]
    except (TypeError, ValueError) as exc:
        raise PermanentError(f"payload cannot be stored: {exc}") from exc


def _linked(entries: Sequence[Entry], payloads: list[tuple[object, str]], fresh: list[int], seqs: list[int],
            actors: dict[str, str], head: str, now: datetime, key: bytes | None) -> Iterator[tuple]:
    """The COPY rows of the ``fresh`` entries (their positions in the batch, from 1), each linked to the one before
    it as it is asked for: asyncpg sends a batch's rows every 512 KB, so the rows after the first part are built
    and hashed while PostgreSQL takes in that part. ``actors``: the actor of a command as received, for an
    outcome that names none."""
    prev, recorded = head, chain.utc_text(now)  # the batch's, formatted once
    for seq, i in zip(seqs, fresh, strict=True):
        e = entries[i - 1]
        payload, text = payloads[i - 1]
        # The hashed fields; the times as their canonical texts where known (the chain writes a time so anyway).
        f = {"seq": seq, "command_id": e.command_id, "actor": e.actor or actors.get(e.command_id),
             "time": e.time_text or e.time, "recorded_at": recorded, "subject": e.subject, "kind": e.kind,
             "job_id": e.job_id, "payload": payload, "outcome": str(e.outcome), "reason": e.reason}
        try:
            digest = chain.row_hash(prev, f, text)
        except UnicodeEncodeError as exc:  # a lone surrogate in a text field: PostgreSQL could not store it either
            raise PermanentError(f"entry cannot be stored: {exc}") from exc
        yield (seq, e.command_id, f["actor"], e.time, now, e.subject, e.kind, e.job_id, text, f["outcome"], e.reason,
               prev, digest, anchoring.row_mac(key, digest) if key is not None else None)
        prev = digest


async def append(conn: asyncpg.Connection, entries: Sequence[Entry], *, role: str | None, now: datetime,
                 chain_name: str = "audit", key: bytes | None = None) -> int:
    """Append entries not stored yet; returns how many were stored. Call outside a transaction.

    With the audit ``key`` each row also carries its mac (HMAC of its hash), which nobody without the key can
    recompute after changing the row. Round trips: begin, role and lock, the plan (``_PLAN``), one COPY, commit."""
    entries = _dedupe(entries)
    if not entries:
        return 0
    payloads = _payloads(entries)  # before the lock: no other writer waits on this
    async with conn.transaction():
        # One simple-protocol message: role, then the lock (taken before the plan's snapshot, which must see
        # every row a previous holder committed).
        await conn.execute((f'SET LOCAL ROLE "{role}"; ' if role else "")
                           + f"SELECT pg_advisory_xact_lock({lock_key(f'audit-chain:{chain_name}')})")
        plan = await conn.fetchrow(_PLAN, [e.command_id for e in entries], [str(e.outcome) for e in entries],
                                   [e.command_id for e in entries if e.actor is None])
        if not plan["fresh"]:
            return 0
        # One binary COPY for the batch; the payload goes as its canonical text (jsonb parses it). A row that
        # cannot be stored fails the COPY (asyncpg aborts it), and with it the transaction: nothing is written.
        await conn.copy_records_to_table("log", schema_name="audit", columns=COLUMNS, records=_linked(
            entries, payloads, plan["fresh"], sorted(plan["seqs"]), dict(plan["actors"] or ()),
            plan["head"] or chain.GENESIS, now, key))
    return len(plan["fresh"])


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    checked: int  # rows checked (up to and including the first bad one)
    first_bad_seq: int | None
    reason: str | None
    macs_checked: int = 0  # with a key only
    pre_key_rows: int = 0  # with a key only: rows before the first mac, protected by the anchors alone


async def verify(pool: asyncpg.Pool, key: bytes | None = None, *, keyed_from: int | None = None) -> VerifyResult:
    """Recompute the whole chain in seq order, page by page; name the first row that does not match.

    Without ``key`` this is the chain alone, which a writer who recomputes every later hash passes; with it every
    row's mac is checked too, mandatory from ``keyed_from`` (what the anchors say) or from the first keyed row."""
    prev_hash, after, checked, macs, pre_key = chain.GENESIS, 0, 0, 0, 0
    async with pool.acquire() as conn:
        while True:
            rows = await conn.fetch(
                "SELECT seq, command_id, actor, time, recorded_at, subject, kind, job_id, payload::text AS payload,"
                " outcome, reason, prev_hash, hash, mac FROM audit.log WHERE seq > $1 ORDER BY seq LIMIT $2",
                after, VERIFY_PAGE)
            if not rows:
                return VerifyResult(True, checked, None, None, macs, pre_key)
            page = [{**dict(r), "payload": json.loads(r["payload"])} for r in rows]
            result = chain.check_chain(page, prev_hash)
            bad_seq, reason = result.first_bad_seq, result.reason
            if key is not None:
                # Only rows up to the chain's first bad one: at the same row the chain's reason is the plainer.
                upto = page if bad_seq is None else [r for r in page if r["seq"] < bad_seq]
                found = anchoring.check_macs(upto, key, keyed_from=keyed_from)
                macs, pre_key, keyed_from = macs + found.checked, pre_key + found.pre_key, found.keyed_from
                if found.first_bad_seq is not None:
                    bad_seq, reason = found.first_bad_seq, found.reason
            if bad_seq is not None:
                checked += sum(1 for r in page if r["seq"] <= bad_seq)
                return VerifyResult(False, checked, bad_seq, reason, macs, pre_key)
            checked += result.checked
            prev_hash, after = result.last_hash, rows[-1]["seq"]


async def head(conn: asyncpg.Connection) -> dict | None:
    """The chain head as an anchor records it: seq, hash, recorded_at, row count, first keyed seq."""
    row = await conn.fetchrow("SELECT seq, hash, recorded_at FROM audit.log ORDER BY seq DESC LIMIT 1")
    if row is None:
        return None
    rows = await conn.fetchval("SELECT count(*) FROM audit.log")
    keyed_from = await conn.fetchval("SELECT min(seq) FROM audit.log WHERE mac IS NOT NULL")
    return {**dict(row), "rows": rows, "keyed_from": keyed_from}


async def hashes_at(conn: asyncpg.Connection, seqs: Sequence[int]) -> tuple[dict[int, str], int | None]:
    """The hashes of the given rows still in the table, and the table's newest seq."""
    found = await conn.fetch("SELECT seq, hash FROM audit.log WHERE seq = ANY($1::bigint[])", list(set(seqs)))
    return {r["seq"]: r["hash"] for r in found}, await conn.fetchval("SELECT max(seq) FROM audit.log")
