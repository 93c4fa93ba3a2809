"""The decisions the check loop used to make inline, now pure rules (services/health/domain/runs.py): which groups'
join runs start, where a wave's all-reduce meets, which report needs a verdict, what a result keeps of its
verdict, a wave's failed verdicts, when a run is done, which nodes an on-demand run takes, and what a node that
failed for good becomes after its group's breaker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from libs.contracts.nodes import CheckStatus, NodeState
from services.health.domain import breaker
from services.health.domain.nodes import ChecksFailed, Node, Registered, ScheduleChecks, Transition, decide
from services.health.domain.runs import (DONE, Busy, MemberStatus, Progress, Result, breaker_applies, by_node,
                                         deadline_of, due_groups, failed_fact, failed_verdicts, judged_verdict,
                                         on_demand_targets, overdue_verdict, rendezvous, run_finished,
                                         unjudged_fact, waits_for_job)
from services.health.domain.verdicts import Verdict
from tests.support.builders import node

pytestmark = pytest.mark.unit
T0 = datetime(2026, 1, 1, tzinfo=UTC)
C = CheckStatus
S = NodeState


def ago(seconds: float) -> datetime:
    return T0 - timedelta(seconds=seconds)


# -- join runs ---------------------------------------------------------------------------------------------------

def test_only_groups_whose_youngest_joiner_waited_the_batch_are_due_in_name_order():
    joining = [("b", ago(10)), ("a", ago(6)), ("c", ago(10)), ("c", ago(1)), ("d", ago(5))]
    assert due_groups(joining, T0, 5.0) == ["a", "b", "d"]


def test_no_joining_node_means_no_join_run():
    assert due_groups([], T0, 5.0) == []


# -- the all-reduce's meeting point ------------------------------------------------------------------------------

@pytest.mark.parametrize(("address", "port", "world", "expected"), [
    ("10.0.0.7:7000", 29500, 2, "10.0.0.7:29500"),
    ("10.0.0.7:7000", 29500, 1, None),
    ("10.0.0.7:7000", None, 4, None),
    ("10.0.0.7:7000", 0, 4, None),
    (None, 29500, 3, "127.0.0.1:29500"),
    ("[fe80::1]:7000", 29500, 2, "[fe80::1]:29500"),
], ids=["rank 0's host", "a wave of one", "no collective port", "port zero", "no address", "ipv6"])
def test_the_rendezvous_is_rank_zeros_host_at_its_collective_port(address, port, world, expected):
    assert rendezvous(address, port, world) == expected


def test_a_deadline_is_the_given_seconds_from_now():
    assert deadline_of(T0, 90.0) == T0 + timedelta(seconds=90)


# -- which reports need a verdict --------------------------------------------------------------------------------

@pytest.mark.parametrize("status", ["busy", *CheckStatus], ids=str)
def test_only_a_final_result_is_judged(status):
    fact = unjudged_fact(status, "matmul" if status != "busy" else None, 2)
    if status == "busy":
        assert fact == Busy()
    elif status in (C.RUNNING, C.PENDING):
        assert fact == Progress("matmul", 2, C(status))
    else:
        assert fact is None


def test_a_judged_attempt_keeps_its_verdict_with_the_attempt_and_whether_it_re_runs():
    v = Verdict(C.FAILED, rerun=True, reason="tflops 3 < 0.8 x median 10")
    kept = judged_verdict(v, 1)
    assert kept["attempt"] == 1 and kept["rerun"] is True
    assert {k: kept[k] for k in v.detail()} == v.detail()


def test_an_overdue_result_keeps_its_reason_and_is_never_re_run():
    r = Result("nccl", C.FAILED, 2, "no report within 60s")
    assert overdue_verdict(r) == {"reason": "no report within 60s", "attempt": 2, "rerun": False, "overdue": True}


# -- a finished wave ---------------------------------------------------------------------------------------------

def test_a_waves_results_are_grouped_per_node_in_order():
    a1, a2, b1 = Result("matmul", C.PASSED), Result("nccl", C.FAILED), Result("matmul", C.PASSED)
    assert by_node([("a", a1), ("a", a2), ("b", b1)]) == {"a": [a1, a2], "b": [b1]}


def test_only_failed_tests_carry_their_verdicts_to_the_drain_reason():
    rows = [("a", Result("matmul", C.PASSED), {"reason": None}),
            ("a", Result("nccl", C.FAILED, 1, "slow"), {"reason": "slow", "ratio": 0.5}),
            ("b", Result("matmul", C.NOT_APPLICABLE), {"reason": "no gpu"}),
            ("b", Result("memory", C.FAILED, 2, "ecc"), {"reason": "ecc"})]
    assert failed_verdicts(rows) == {"a": [("nccl", {"reason": "slow", "ratio": 0.5})],
                                     "b": [("memory", {"reason": "ecc"})]}


@pytest.mark.parametrize("statuses", [
    (), (MemberStatus.PASSED,), (MemberStatus.FAILED, MemberStatus.PASSED),
    (MemberStatus.PASSED, MemberStatus.WAITING), (MemberStatus.PENDING,), (MemberStatus.RUNNING, MemberStatus.FAILED),
], ids=["no member", "passed", "all done", "one waiting", "one pending", "one running"])
def test_a_run_is_done_once_every_member_passed_or_failed(statuses):
    assert run_finished(statuses) is all(s in DONE for s in statuses)
    assert run_finished(statuses) is not any(s in (MemberStatus.WAITING, MemberStatus.PENDING, MemberStatus.RUNNING)
                                             for s in statuses)


# -- on-demand runs ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("state", list(NodeState), ids=str)
@pytest.mark.parametrize("cordoned", [False, True], ids=["free", "cordoned"])
def test_an_on_demand_run_takes_ready_uncordoned_nodes_and_says_why_it_skips_the_others(state, cordoned):
    n = node(state, cordoned=cordoned, run_id="r0" if cordoned else None)
    targets, skipped = on_demand_targets([n])
    if state is S.READY and not cordoned:
        assert (targets, skipped) == ([n], {})
    else:
        assert targets == []
        assert skipped == {"n1": "cordoned for run r0" if cordoned else state.value}


def test_targets_keep_the_order_given():
    ns = [node(S.READY, node_id="a"), node(S.FAILED, node_id="b"), node(S.READY, node_id="c")]
    assert [n.node_id for n in on_demand_targets(ns)[0]] == ["a", "c"]


@pytest.mark.parametrize(("busy", "force", "waits"), [
    (True, False, True), (True, True, False), (False, False, False), (False, True, False)],
    ids=["busy", "busy, forced", "idle", "idle, forced"])
def test_a_busy_target_waits_for_its_job_unless_forced(busy, force, waits):
    assert waits_for_job("ex1", {"ex1"} if busy else {"ex9"}, force=force) is waits


def test_a_node_without_executor_is_never_busy():
    assert waits_for_job(None, {"ex1"}, force=False) is False


# -- a node that failed for good ---------------------------------------------------------------------------------

@pytest.mark.parametrize("state", list(NodeState), ids=str)
@pytest.mark.parametrize("run_id", ["r1", "r2"], ids=["this run", "another run"])
def test_the_breaker_counts_only_a_failure_of_a_node_checking_in_this_run(state, run_id):
    n = Node("n1", "g", "ex1", state, run_id=run_id)
    assert breaker_applies(n, "r1") is (state is S.CHECKING and run_id == "r1")


def test_the_breaker_ignores_a_failure_of_an_unknown_node():
    assert breaker_applies(None, "r1") is False


def alert_guard() -> breaker.Guard:
    return breaker.Guard("g", (), breaker.Alert("3 nodes failed nccl", T0, frozenset({"nccl"}), ("a", "b", "c")))


@pytest.mark.parametrize("verdict", list(breaker.Verdict), ids=str)
def test_a_held_group_keeps_its_failed_node_held_and_otherwise_the_usual_path_goes_on(verdict):
    guard = alert_guard() if verdict is not breaker.Verdict.PROCEED else breaker.Guard("g", (), None)
    fact = failed_fact("r1", "nccl: slow", breaker.Decision(guard, verdict))
    if verdict is breaker.Verdict.PROCEED:
        assert fact == ChecksFailed("r1", "nccl: slow")
    else:
        assert fact == ChecksFailed("r1", "nccl: slow", hold="3 nodes failed nccl")


def test_without_the_breaker_a_failure_is_plain():
    assert failed_fact("r1", "failed", None) == ChecksFailed("r1", "failed")


# -- the lifecycle says when a node is due for checks ------------------------------------------------------------

def test_a_transition_schedules_checks_exactly_when_it_asks_for_them():
    t = decide(None, Registered("n1", "ex1", "g", "boot-1"), T0)
    assert isinstance(t, Transition)
    assert t.schedules_checks is any(isinstance(e, ScheduleChecks) for e in t.effects)
    assert t.schedules_checks  # a new node is checked before it takes work
    assert Transition(t.node).schedules_checks is False
