"""Waiting reasons of the queued jobs beyond a placement pass (services/queue/tenancy/beyond.py): issue 26, 91
of 291 queued jobs said nothing because the pass considers 200."""

from __future__ import annotations

import pytest

from services.queue.tenancy.placement_types import WaitCode
from services.queue.tenancy.beyond import beyond_due, beyond_pass

pytestmark = pytest.mark.unit


def test_every_job_beyond_the_pass_is_behind_the_ones_before_it_in_order():
    order = ["a", "b", "c", "d", "e"]
    waits = beyond_pass(order, considered=["a", "b"])
    assert [(w.job_id, w.code, w.numbers) for w in waits] == [
        ("c", WaitCode.BEHIND, {"ahead": 2, "considered": 2}),
        ("d", WaitCode.BEHIND, {"ahead": 3, "considered": 2}),
        ("e", WaitCode.BEHIND, {"ahead": 4, "considered": 2})]
    assert waits[0].reason == ("behind 2 jobs: beyond the 2 queued jobs this placement pass considered, "
                               "in fair-share order")


def test_the_jobs_the_pass_considered_keep_the_reason_admission_gave_them():
    assert beyond_pass(["a", "b"], considered=["a", "b"]) == []
    assert beyond_pass([], considered=["a"]) == []
    # A considered job found later in the order (the queue moved between the two reads) is still left to admission.
    assert [w.job_id for w in beyond_pass(["c", "a"], considered=["a"])] == ["c"]


def test_a_reason_that_would_not_change_is_not_written_again():
    order = ["a", "b", "c", "d"]
    waits = beyond_pass(order, considered=["a"], stored_ahead={"b": 1, "c": 1, "d": None})
    assert [(w.job_id, w.numbers["ahead"]) for w in waits] == [("c", 2), ("d", 3)]


@pytest.mark.parametrize(("since_last", "refresh", "due"), [
    (None, 5.0, True),   # the first whole pass: at once
    (4.9, 5.0, False),   # a draining queue moves every position each pass: not rewritten every 0.5 s
    (5.0, 5.0, True),
    (0.0, 0.0, True),    # 0: every whole pass
])
def test_the_reasons_beyond_a_pass_are_brought_up_to_date_at_most_once_per_refresh(since_last, refresh, due):
    assert beyond_due(since_last, refresh) is due
