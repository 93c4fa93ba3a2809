"""Check runs as pure rules (services/health/domain/runs.py): join batching, stale reports, the service-side
deadline, and a finished wave's outcome per node."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from libs.contracts.nodes import CheckStatus
from services.health.domain.runs import (DONE, STARTED, Member, MemberStatus, Outcome, Result, join_run_due,
                                         on_deadline, overdue, run_kind, stale_member, stale_report, started,
                                         wave_outcomes)
from services.health.domain.verdicts import FINAL

pytestmark = pytest.mark.unit
T0 = datetime(2026, 1, 1, tzinfo=UTC)
M = MemberStatus
C = CheckStatus
DEADLINE = 60.0


def member(status: MemberStatus, deadline: datetime | None = T0 + timedelta(seconds=DEADLINE)) -> Member:
    return Member("r1", "n1", status, 1, deadline if status in STARTED else None)


# -- starting ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("ages", "due"), [
    ([], False), ([10.0], True), ([5.0], True), ([4.9], False), ([10.0, 1.0], False), ([10.0, 6.0], True)],
    ids=["nobody", "waited", "exactly the batch", "too young", "youngest too young", "all waited"])
def test_a_join_run_starts_once_the_youngest_joiner_has_waited_the_batch_time(ages, due):
    assert join_run_due([T0 - timedelta(seconds=a) for a in ages], T0, 5.0) is due


@pytest.mark.parametrize(("reboots", "kind"), [([0], "join"), ([0, 0], "join"), ([0, 1], "recovery"), ([2], "recovery")])
def test_a_run_with_a_rebooted_node_is_a_recovery_run(reboots, kind):
    assert run_kind(reboots) == kind


def test_a_started_member_is_pending_with_a_deadline():
    m = started(Member("r1", "n1", M.WAITING), wave=2, now=T0, deadline_seconds=DEADLINE)
    assert (m.status, m.wave, m.deadline) == (M.PENDING, 2, T0 + timedelta(seconds=DEADLINE))


# -- reports -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("status", list(MemberStatus), ids=str)
def test_only_a_started_member_takes_reports(status):
    why = stale_member(member(status))
    assert (why is None) is (status in STARTED)
    if status in DONE or status is M.WAITING:
        assert str(status) in why


def test_a_report_about_a_node_not_in_the_run_is_old_news():
    assert stale_member(None) == "not a member of this run"
    assert stale_report(None, Result("matmul", C.PENDING), 1) == "not a member of this run"


@pytest.mark.parametrize("status", list(CheckStatus), ids=str)
@pytest.mark.parametrize("attempt", [1, 2], ids=["attempt 1", "attempt 2"])
def test_a_report_counts_only_for_the_current_attempt_of_an_unfinished_test(status, attempt):
    why = stale_report(member(M.RUNNING), Result("matmul", status, attempt=2), 1 if attempt == 1 else 2)
    applies = attempt == 2 and status not in FINAL
    assert (why is None) is applies, why


def test_a_report_about_a_test_not_asked_is_old_news():
    assert stale_report(member(M.PENDING), None, 1) == "test not asked in this run"


# -- the deadline --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("status", list(MemberStatus), ids=str)
@pytest.mark.parametrize("seconds", [0.0, DEADLINE - 1, DEADLINE, DEADLINE + 1], ids=lambda s: f"{s:g}s")
def test_only_a_started_member_past_its_deadline_is_overdue(status, seconds):
    assert overdue(member(status), T0 + timedelta(seconds=seconds)) is (status in STARTED and seconds >= DEADLINE)


def test_a_member_without_deadline_is_never_overdue():
    assert not overdue(Member("r1", "n1", M.RUNNING, 1, None), T0 + timedelta(days=30))


def test_an_overdue_report_fails_every_unfinished_test_with_the_reason_and_no_rerun():
    results = [Result("nvml", C.NOT_APPLICABLE), Result("matmul", C.PASSED), Result("membw", C.RUNNING),
               Result("allreduce", C.PENDING, attempt=2)]
    failed = on_deadline(member(M.RUNNING), results, T0 + timedelta(seconds=DEADLINE), DEADLINE)
    assert [(r.test, r.status, r.attempt) for r in failed] == [("membw", C.FAILED, 1), ("allreduce", C.FAILED, 2)]
    assert all("no report within 60s" in r.reason for r in failed)


@pytest.mark.parametrize("status", list(MemberStatus), ids=str)
def test_nothing_fails_before_the_deadline(status):
    assert on_deadline(member(status), [Result("matmul", C.PENDING)], T0 + timedelta(seconds=1), DEADLINE) == ()


# -- a finished wave -----------------------------------------------------------------------------------------

def test_a_wave_has_no_outcome_while_any_test_of_any_node_is_unfinished():
    results = {"n1": [Result("matmul", C.PASSED)], "n2": [Result("matmul", C.PASSED), Result("membw", C.RUNNING)]}
    assert wave_outcomes(results) is None
    assert wave_outcomes({}) is None


def test_a_finished_wave_passes_and_fails_each_node_with_the_failed_tests_and_reasons():
    results = {"n1": [Result("matmul", C.PASSED), Result("nvml", C.NOT_APPLICABLE)],
               "n2": [Result("matmul", C.FAILED, 2, "wrong result"), Result("membw", C.FAILED, 1, None),
                      Result("nvml", C.PASSED)]}
    assert wave_outcomes(results) == {
        "n1": Outcome(C.PASSED),
        "n2": Outcome(C.FAILED, "matmul: wrong result; membw: failed", frozenset({"matmul", "membw"}))}
