"""The audit hash chain and what an entry records: hashing is canonical, verify names the first bad row for
every kind of tampering, and any message (even a hostile one) becomes an entry PostgreSQL can store."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from libs.contracts.commands import CommandOutcome, SubmitJob
from libs.contracts.envelope import RejectedMessage
from services.audit.domain import chain, entries
from services.audit.domain.entries import Outcome

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def make_rows(n: int = 5) -> list[dict]:
    return chain.chain({"seq": i + 1, "command_id": f"c{i}", "actor": "alice", "time": T0 + timedelta(seconds=i),
                        "recorded_at": T0, "subject": "teto.cmd.submit", "kind": "submit", "job_id": f"j{i}",
                        "payload": {"n": i, "spec": {"b": 1.5, "a": [1, 2]}}, "outcome": "received", "reason": None}
                       for i in range(n))


def rehash(row: dict, **change) -> None:
    row.update(change)
    row["hash"] = chain.row_hash(row["prev_hash"], row)


def test_an_untouched_chain_verifies():
    rows = make_rows()
    assert chain.verify(rows) is None
    assert rows[0]["prev_hash"] == chain.GENESIS and rows[1]["prev_hash"] == rows[0]["hash"]
    assert chain.verify([]) is None


def test_hash_is_canonical_in_key_order_and_time_zone():
    row = make_rows(1)[0]
    reordered = {**row, "payload": {"spec": {"a": [1, 2], "b": 1.5}, "n": 0},
                 "time": row["time"].astimezone(timezone(timedelta(hours=5)))}
    assert chain.row_hash(chain.GENESIS, reordered) == row["hash"]


@pytest.mark.parametrize(("tamper", "bad_seq"), [
    (lambda rows: rows[2].update(actor="mallory"), 3),
    (lambda rows: rows[2]["payload"].update(n=99), 3),
    (lambda rows: rows[4].update(outcome="accepted"), 5),
    (lambda rows: rows.pop(1), 3),  # a removed row: the next one no longer links
    (lambda rows: rows.insert(2, rows[0]), 1),  # a duplicated row (seq 1 again after seq 2)
    (lambda rows: rows[0].update(hash="f" * 64), 1),
    (lambda rows: rehash(rows[1], actor="mallory"), 3),  # a consistent forgery still breaks the next link
], ids=["actor-changed", "payload-changed", "outcome-changed", "row-deleted", "row-inserted", "hash-forged",
        "changed-and-rehashed"])
def test_verify_names_the_first_row_that_does_not_match(tamper, bad_seq):
    rows = make_rows()
    tamper(rows)
    assert chain.verify(rows) == bad_seq


def test_check_chain_continues_across_pages():
    rows = make_rows(6)
    first = chain.check_chain(rows[:3])
    rest = chain.check_chain(rows[3:], first.last_hash)
    assert first.first_bad_seq is None and rest.first_bad_seq is None and rest.checked == 3
    assert chain.check_chain(rows[3:]).first_bad_seq == 4  # without the previous page's hash it does not link


def test_command_entry_reads_the_command():
    cmd = SubmitJob(actor="alice", spec={"workload": {"kind": "finetune"}})
    e = entries.from_command("teto.cmd.submit", cmd.encode(), "CMD-1", T0)
    assert (e.command_id, e.actor, e.kind, e.job_id, e.outcome) == (cmd.command_id, "alice", "submit", cmd.job_id,
                                                                     Outcome.RECEIVED)
    assert e.time == cmd.issued_at and e.payload["spec"]["workload"]["kind"] == "finetune"


def test_hostile_command_is_still_recorded_as_storable_text():
    e = entries.from_command("teto.cmd.submit", b'\x00\xff{"actor": 5, not json', "CMD-7", T0)
    assert e.command_id == "CMD-7" and e.actor is None and e.time == T0
    assert "\x00" not in e.payload["raw"] and e.payload["bytes"] == 23
    odd = entries.from_command("teto.cmd.x", b'{"command_id": "a b", "v": NaN, "s": "x\\u0000y", "w": 1e999}',
                               "CMD-8", T0)
    assert odd.command_id == "CMD-8" and odd.payload == {"command_id": "a b", "v": "nan", "s": "x\ufffdy", "w": "inf"}
    json.dumps(odd.payload, allow_nan=False)


@pytest.mark.parametrize("accepted", [True, False], ids=["accepted", "refused"])
def test_outcome_entry(accepted):
    out = CommandOutcome(command_id="c1", kind="requeue", accepted=accepted, reason=None if accepted else "too low",
                         job_id="j1", by="queue", detail={"actor": "bob"} if not accepted else {})
    e = entries.from_outcome("teto.outcome.requeue.c1", out.encode(), "OUTCOME-3", T0)
    assert e.outcome == (Outcome.ACCEPTED if accepted else Outcome.REFUSED)
    assert (e.command_id, e.kind, e.job_id) == ("c1", "requeue", "j1")
    assert e.actor == (None if accepted else "bob") and e.reason == (None if accepted else "too low")
    bad = entries.from_outcome("teto.outcome.x.y", b"[]", "OUTCOME-4", T0)
    assert bad.outcome == Outcome.REJECTED and bad.command_id == "OUTCOME-4"


def test_rejected_entry_names_the_original_subject_and_reason():
    note = RejectedMessage(service="queue", subject="teto.cmd.submit", reason="actor: missing",
                           payload_excerpt='{"job_id": "j9", "actor": "eve"}', payload_bytes=30)
    e = entries.from_rejected("teto.rejected.queue", note.encode(), "REJ-1", T0)
    assert (e.command_id, e.subject, e.kind, e.actor, e.job_id) == (note.id, "teto.cmd.submit", "submit", "eve", "j9")
    assert e.outcome == Outcome.REJECTED and e.reason == "actor: missing"
