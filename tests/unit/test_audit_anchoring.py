"""The rules that make the audit log hold against someone who can write its table: every row's mac, and the
anchors (the chain head kept outside the database). Pure: the attacks are played on lists of rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.audit.domain import anchoring, chain

pytestmark = pytest.mark.unit

KEY = b"k" * 32
WRONG = b"w" * 32
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def make_rows(n: int = 6, key: bytes | None = KEY, keyed_from: int = 1) -> list[dict]:
    rows = chain.chain({"seq": i + 1, "command_id": f"c{i}", "actor": "alice", "time": T0, "recorded_at": T0,
                        "subject": "teto.cmd.submit", "kind": "submit", "job_id": f"j{i}", "payload": {"n": i},
                        "outcome": "received", "reason": None} for i in range(n))
    for row in rows:
        row["mac"] = anchoring.row_mac(key, row["hash"]) if key is not None and row["seq"] >= keyed_from else None
    return rows


def rewrite(rows: list[dict], seq: int, mac_key: bytes | None = None, **change) -> None:
    """The superuser's attack: change a row, recompute its hash and every later one (and, with a key, macs)."""
    prev = rows[seq - 2]["hash"] if seq > 1 else chain.GENESIS
    for row in rows[seq - 1:]:
        if row["seq"] == seq:
            row.update(change)
        row["prev_hash"] = prev
        row["hash"] = chain.row_hash(prev, row)
        if mac_key is not None:
            row["mac"] = anchoring.row_mac(mac_key, row["hash"])
        prev = row["hash"]


def anchor_of(rows: list[dict], upto: int, stream_seq: int = 1, key: bytes | None = KEY) -> dict:
    row = rows[upto - 1]
    head = {"seq": row["seq"], "hash": row["hash"], "rows": upto, "recorded_at": T0, "keyed_from": 1}
    return {**anchoring.make_anchor(head, key), "stream_seq": stream_seq, "time": T0 + timedelta(seconds=upto)}


def stored(rows: list[dict]) -> dict[int, str]:
    return {r["seq"]: r["hash"] for r in rows}


def test_intact_rows_pass_and_every_mac_is_counted():
    found = anchoring.check_macs(make_rows(), KEY)
    assert found == anchoring.MacCheck(None, None, 6, 0, 1)


def test_a_rewrite_with_recomputed_hashes_passes_the_chain_but_not_the_macs():
    rows = make_rows()
    rewrite(rows, 3, payload={"n": "forged"})
    assert chain.verify(rows) is None  # the attack today's verify accepts
    found = anchoring.check_macs(rows, KEY)
    assert found.first_bad_seq == 3 and "mac does not match" in found.reason and found.checked == 2


def test_macs_forged_with_another_key_are_refused():
    rows = make_rows()
    rewrite(rows, 4, mac_key=WRONG, actor="mallory")
    assert anchoring.check_macs(rows, KEY).first_bad_seq == 4


def test_pre_key_rows_pass_but_a_missing_mac_after_the_first_keyed_row_does_not():
    rows = make_rows(keyed_from=3)
    assert anchoring.check_macs(rows, KEY) == anchoring.MacCheck(None, None, 4, 2, 3)
    rows[4]["mac"] = None  # stripped: would turn a rewritten row into a "pre-key" one
    found = anchoring.check_macs(rows, KEY)
    assert found.first_bad_seq == 5 and "mac missing" in found.reason


def test_stripping_every_mac_is_seen_against_what_the_anchors_say():
    rows = make_rows()
    for row in rows:
        row["mac"] = None
    assert anchoring.check_macs(rows, KEY).first_bad_seq is None  # alone it looks like a pre-key log
    assert anchoring.check_macs(rows, KEY, keyed_from=1).first_bad_seq == 1


def test_keyed_from_is_carried_across_pages():
    rows = make_rows()
    first = anchoring.check_macs(rows[:3], KEY)
    rows[4]["mac"] = None
    assert anchoring.check_macs(rows[3:], KEY, keyed_from=first.keyed_from).first_bad_seq == 5


def test_row_and_anchor_macs_cannot_stand_in_for_each_other():
    rows = make_rows()
    anchor = anchor_of(rows, 6)
    assert anchor["mac"] != anchoring.row_mac(KEY, rows[5]["hash"])
    assert anchoring.anchor_mac(KEY, {**anchor, "rows": 7}) != anchor["mac"]  # every anchored field is covered


def test_anchors_that_agree_with_the_table_pass():
    rows = make_rows()
    anchors = [anchor_of(rows, 2, 1), anchor_of(rows, 5, 2)]
    found = anchoring.check_anchors(anchors, stored(rows), 6, KEY)
    assert (found.reason, found.checked, found.last_seq, found.keyed_from) == (None, 2, 5, 1)
    assert found.last_time == T0 + timedelta(seconds=5)


def test_a_rewrite_before_an_anchor_is_named_against_it():
    rows = make_rows()
    anchors = [anchor_of(rows, 2, 1), anchor_of(rows, 5, 2)]
    rewrite(rows, 4, mac_key=WRONG, payload={"n": "forged"})
    found = anchoring.check_anchors(anchors, stored(rows), 6, KEY)
    assert (found.first_bad_anchor, found.bad_seq, found.checked) == (2, 5, 1) and "rewritten" in found.reason


def test_a_truncation_is_named_against_the_newest_anchor():
    rows = make_rows()
    anchors = [anchor_of(rows, 6, 1)]
    found = anchoring.check_anchors(anchors, stored(rows[:4]), 4, KEY)
    assert (found.first_bad_anchor, found.bad_seq) == (1, 5) and found.reason.startswith("truncated")
    emptied = anchoring.check_anchors(anchors, {}, None, KEY)
    assert emptied.bad_seq == 1 and "is empty" in emptied.reason


def test_a_missing_anchored_row_is_named():
    rows = make_rows()
    table = stored(rows)
    del table[3]
    found = anchoring.check_anchors([anchor_of(rows, 3)], table, 6, KEY)
    assert found.bad_seq == 3 and "missing" in found.reason


def test_a_forged_anchor_is_refused_and_an_unsigned_one_only_counted():
    rows = make_rows()
    forged = anchor_of(rows, 6, key=WRONG)
    found = anchoring.check_anchors([forged], stored(rows), 6, KEY)
    assert found.first_bad_anchor == 1 and "not made with the audit key" in found.reason
    unsigned = anchor_of(rows, 6, key=None)
    found = anchoring.check_anchors([unsigned], stored(rows), 6, KEY)
    assert found.reason is None and found.unsigned == 1
    assert found.keyed_from is None  # an unsigned anchor cannot say where macs begin: anyone could have sent it


@pytest.mark.parametrize("stream_seqs, first", [((1, 3), 1), ((2, 3), 1), ((5,), 4)],
                         ids=["gap", "late start", "late start and stream"])
def test_anchors_removed_from_the_stream_are_seen(stream_seqs, first):
    rows = make_rows()
    anchors = [anchor_of(rows, i + 2, s) for i, s in enumerate(stream_seqs)]
    found = anchoring.check_anchors(anchors, stored(rows), 6, KEY, first_stream_seq=first)
    assert found.first_bad_anchor is not None and "removed from the stream" in found.reason


@pytest.mark.parametrize("head, last, worth", [(None, 0, False), (5, 5, False), (6, 5, True), (3, 5, False)],
                         ids=["empty log", "unchanged", "moved", "went back (rows removed)"])
def test_only_a_head_that_moved_forward_is_anchored(head, last, worth):
    assert anchoring.worth_anchoring(head, last) is worth


def test_junk_on_the_anchor_subject_claims_nothing_but_still_counts_in_the_stream():
    rows = make_rows()
    anchors = [anchor_of(rows, 2, 1), {"stream_seq": 2, "malformed": "not JSON"}, anchor_of(rows, 5, 3)]
    found = anchoring.check_anchors(anchors, stored(rows), 6, KEY)
    assert (found.reason, found.checked, found.malformed, found.last_seq) == (None, 2, 1, 5)


def _anchor_failure(bad_seq: int | None, reason: str | None) -> anchoring.AnchorCheck:
    return anchoring.AnchorCheck(1 if reason else None, bad_seq, reason, 0, 0, 0, None, None, None)


@pytest.mark.parametrize("row, anchor, weak, expected", [
    ((None, None), (None, None), (), (None, None)),
    ((8, "mac"), (None, None), (), (8, "mac")),
    ((None, None), (5, "truncated"), (), (5, "truncated")),
    ((3, "mac"), (6, "rewritten"), (), (3, "mac")),
    ((7, "mac"), (6, "rewritten"), (), (6, "rewritten")),
    ((8, "mac"), (None, "forged anchor"), (), (8, "mac")),
    ((None, None), (None, "forged anchor"), (), (None, "forged anchor")),
    ((None, None), (None, None), ("max_msgs is 1",), (None, "the anchor stream's configuration was weakened: "
                                                      "max_msgs is 1")),
    ((8, "mac"), (None, None), ("max_msgs is 1",), (8, "mac")),
], ids=["all holds", "row only", "anchor only", "row earlier", "anchor earlier", "rowless anchor vs row",
        "rowless anchor alone", "weak stream alone", "row beats weak stream"])
def test_verify_names_the_earliest_failure(row, anchor, weak, expected):
    assert anchoring.verdict(*row, _anchor_failure(*anchor), weak) == expected
