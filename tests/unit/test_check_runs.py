"""Check runs as pure rules (services/health/domain/runs.py): join batching, stale reports, the service-side
deadline, and a finished wave's outcome per node."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from libs.contracts.nodes import CheckStatus
from services.health.domain.runs import (DONE, STARTED, Busy, DeadlinePassed, Deferred, FinishWave, Judged, Member,
                                         MemberStatus, Outcome, Progress, Rerun, Result, Step, decide,
                                         join_run_due, on_deadline, overdue, run_kind, stale_member, stale_report,
                                         started, wave_outcomes)
from services.health.domain.verdicts import FINAL, Verdict

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


# -- decide: every member status against every fact ---------------------------------------------------------

PASS = Verdict(C.PASSED, False)
FAIL_ONCE = Verdict(C.FAILED, True, "wrong result")
FAIL = Verdict(C.FAILED, False, "wrong result")
FACTS = {"progress": Progress("matmul", 1, C.RUNNING), "passed": Judged("matmul", 1, PASS),
         "failed, re-run due": Judged("matmul", 1, FAIL_ONCE), "failed for good": Judged("matmul", 1, FAIL),
         "busy": Busy(), "deadline": DeadlinePassed(DEADLINE)}
PAIRS = [(st, f) for st in MemberStatus for f in FACTS]
LATE = T0 + timedelta(seconds=DEADLINE + 1)


def step(status: MemberStatus, fact_name: str, now: datetime = T0) -> Step:
    result = Result("matmul", C.PENDING, 1)
    return decide(member(status), result, FACTS[fact_name], now, deadline_seconds=DEADLINE, results=[result])


@pytest.mark.parametrize(("status", "fact"), PAIRS, ids=[f"{s.name} => {f}" for s, f in PAIRS])
def test_every_member_status_and_fact(status, fact):
    """Only a started member takes facts; a finished or waiting one ignores them (old news, counted)."""
    now = LATE if fact == "deadline" else T0
    got = step(status, fact, now)
    if status not in STARTED:
        assert got.ignored is not None and got.member == member(status) and not got.results and not got.effects
        return
    assert got.ignored is None
    expected = {
        "progress": ((M.RUNNING, member(status).deadline), [("matmul", C.RUNNING, 1)], ()),
        "passed": ((status, member(status).deadline), [("matmul", C.PASSED, 1)], (FinishWave(),)),
        "failed, re-run due": ((status, now + timedelta(seconds=DEADLINE)), [("matmul", C.PENDING, 2)],
                               (Rerun("matmul", 2, False),)),
        "failed for good": ((status, member(status).deadline), [("matmul", C.FAILED, 1)], (FinishWave(),)),
        "busy": ((M.WAITING, None), [], (Deferred(),)),
        "deadline": ((status, None), [("matmul", C.FAILED, 1)], (FinishWave(),)),
    }[fact]
    assert (got.member.status, got.member.deadline) == expected[0]
    assert [(r.test, r.status, r.attempt) for r in got.results] == expected[1]
    assert got.effects == expected[2]


def test_a_failed_allreduce_re_runs_on_the_whole_wave():
    result = Result("allreduce", C.RUNNING, 1)
    got = decide(member(M.RUNNING), result, Judged("allreduce", 1, FAIL_ONCE), T0, deadline_seconds=DEADLINE)
    assert got.effects == (Rerun("allreduce", 2, True),)


def test_a_final_result_keeps_the_verdicts_reason():
    got = step(M.RUNNING, "failed for good")
    assert got.results[0].reason == "wrong result"


def test_a_report_of_an_older_attempt_is_ignored():
    got = decide(member(M.RUNNING), Result("matmul", C.PENDING, 2), Judged("matmul", 1, PASS), T0,
                 deadline_seconds=DEADLINE)
    assert got.ignored == "attempt 1 is not the current attempt 2" and not got.effects


def test_before_its_deadline_a_member_is_not_overdue():
    assert step(M.RUNNING, "deadline", T0).ignored == "not overdue"


def test_an_overdue_member_whose_tests_are_all_final_is_only_disarmed():
    """It waits on the other nodes of its wave; it must not be picked again on every tick."""
    done = Result("matmul", C.PASSED, 1)
    got = decide(member(M.RUNNING), None, DeadlinePassed(DEADLINE), LATE, deadline_seconds=DEADLINE, results=[done])
    assert got.ignored is None and got.member.deadline is None and not got.results and not got.effects


def test_a_fact_about_no_member_is_none():
    assert decide(None, None, Busy(), T0, deadline_seconds=DEADLINE) is None
