"""What a client that did not wait learns of its command (``Prefer: respond-async``, ``GET /v1/commands/{id}``):
the preference read as RFC 7240 writes it, and the command's state from its audit rows (pure)."""

from __future__ import annotations

import pytest

from services.gateway.domain.outcomes import command_view, prefers_async

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("header", "wanted"), [
    (None, False), ("", False), ("respond-async", True), ("Respond-Async", True), ("wait=10, respond-async", True),
    ("respond-async; foo=bar", True), ("  respond-async  ,return=minimal", True), ("return=representation", False),
    ("respond-asynchronously", False), ("x-respond-async", False), ("respond-async=1", True)])
def test_the_prefer_header_asks_for_respond_async_as_rfc_7240_writes_it(header, wanted):
    assert prefers_async(header) is wanted


RECEIVED = {"seq": 7, "command_id": "c1", "actor": "alice", "time": "2026-12-02T10:00:00Z", "kind": "submit",
            "job_id": "j1", "payload": {"spec": {}}, "outcome": "received", "reason": None}


def outcome(accepted: bool, seq: int = 9, **kw) -> dict:
    return {"seq": seq, "command_id": "c1", "actor": None, "time": "2026-12-02T10:00:01Z", "kind": "submit",
            "job_id": "j1", "outcome": "accepted" if accepted else "refused", "reason": kw.get("reason"),
            "payload": {"accepted": accepted, "by": kw.get("by", "queue"), "detail": kw.get("detail", {})}}


def test_nothing_recorded_is_none_and_a_receipt_alone_is_pending():
    assert command_view([]) is None
    view = command_view([RECEIVED])
    assert view["status"] == "pending" and view["actor"] == "alice" and view["job_id"] == "j1"
    assert view["received_at"] == RECEIVED["time"] and view["decided_at"] is None and view["by"] is None


def test_the_outcome_decides_with_its_reason_deciding_part_and_detail():
    view = command_view([RECEIVED, outcome(False, reason="new ceiling below consumed + 60 s",
                                           detail={"minimum_seconds": 160.0})])
    assert view["status"] == "refused" and view["reason"].startswith("new ceiling") and view["by"] == "queue"
    assert view["detail"] == {"minimum_seconds": 160.0} and view["actor"] == "alice"  # the receipt names the actor
    assert view["decided_at"] == "2026-12-02T10:00:01Z"
    assert command_view([RECEIVED, outcome(True)])["status"] == "accepted"


def test_a_gateway_refusal_has_no_receipt_and_the_last_outcome_counts():
    alone = {**outcome(False, seq=3, reason="missing permission finetune:submit", by="gateway"), "actor": "bob"}
    view = command_view([alone])
    assert view["status"] == "refused" and view["by"] == "gateway" and view["actor"] == "bob"
    assert view["received_at"] is None and view["kind"] == "submit"
    assert command_view([RECEIVED, outcome(False, seq=8), outcome(True, seq=9)])["status"] == "accepted"
