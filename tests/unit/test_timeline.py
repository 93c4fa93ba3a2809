"""A job's events as a timeline (libs/timeline.py): the panel's job page and ``teto job`` fold runs of
checkpoints into one row each."""

from __future__ import annotations

import pytest

from libs.timeline import timeline

pytestmark = pytest.mark.unit


def ev(seq, event, epoch=1, step=None, state="running", **kw):
    detail = {"step": step} if step is not None else {}
    return {"seq": seq, "event": event, "epoch": epoch, "state": state, "time": f"t{seq}", "detail": detail,
            "executor_id": "ex-1", "reason": None, **kw}


def test_the_timeline_folds_a_run_of_checkpoints_into_one_row_newest_first():
    events = [ev(1, "submitted", 0, state="queued"), ev(2, "leased"), ev(3, "started"),
              *(ev(3 + i, "checkpointed", step=2 * i) for i in range(1, 501)),
              ev(504, "interrupted", state="interrupted", reason="gpu_ceiling")]
    shown = timeline(events)
    assert [r["event"] for r in shown["rows"]] == ["interrupted", "checkpointed", "started", "leased", "submitted"]
    folded = shown["rows"][1]
    assert folded["count"] == 500 and (folded["first_step"], folded["last_step"]) == (2, 1000)
    assert (folded["time"], folded["last_time"]) == ("t4", "t503")
    assert (folded["seq"], folded["last_seq"]) == (4, 503) and shown["rows"][2]["last_seq"] == 3
    assert shown["rows"][0]["reason"] == "gpu_ceiling" and shown["earlier"] is False


def test_the_timeline_folds_only_consecutive_checkpoints_of_one_epoch():
    events = [ev(10, "checkpointed", 1, step=2), ev(11, "checkpointed", 1, step=4), ev(12, "signal"),
              ev(13, "checkpointed", 1, step=6), ev(14, "checkpointed", 2, step=8), ev(15, "started", 2),
              ev(16, "started", 2)]
    rows = timeline(events)["rows"][::-1]
    assert [(r["event"], r["epoch"], r["count"]) for r in rows] == [
        ("checkpointed", 1, 2), ("signal", 1, 1), ("checkpointed", 1, 1), ("checkpointed", 2, 1), ("started", 2, 1),
        ("started", 2, 1)]  # only checkpoints fold: two starts (two gang ranks) stay two rows
    assert rows[2]["first_step"] == rows[2]["last_step"] == 6 and rows[1]["first_step"] is None


def test_the_timeline_says_when_older_events_than_those_shown_exist():
    assert timeline([ev(201, "checkpointed", step=9)])["earlier"] is True
    assert timeline([ev(1, "submitted", 0)])["earlier"] is False
    assert timeline([]) == {"rows": [], "earlier": False}


def test_the_timeline_shows_no_step_it_cannot_read():
    rows = timeline([ev(1, "checkpointed", step=True), {"seq": 2, "event": "checkpointed", "epoch": 1,
                                                                   "detail": "x"}])["rows"]
    assert rows[0]["count"] == 2 and rows[0]["first_step"] is None and rows[0]["last_step"] is None


def test_a_start_says_which_checkpoint_step_it_resumed_from():
    """Issue 26: the timeline says "resumed from step N" (the ``started`` event's ``resumed_from_step``)."""
    events = [ev(1, "started", 1, detail={"resumed_from_step": None}),
              ev(2, "checkpointed", 1, step=20), ev(3, "requeued", 1, state="queued", reason="health_check"),
              ev(4, "started", 2, detail={"resumed_from_step": 20, "resumed_from": "/c/step-20.pt"})]
    rows = timeline(events)["rows"][::-1]
    assert [(r["event"], r["resumed_from"]) for r in rows] == [
        ("started", None), ("checkpointed", None), ("requeued", None), ("started", 20)]
