"""The replacement circuit breaker (services/health/domain/breaker.py): a budget per group and window, the
same-test-again verdict, the standing alert, and the operator's clear."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.health.domain.breaker import (Alert, Clear, Decision, Guard, NodeFailed, Policy, Refusal,
                                            Replacement, Verdict, decide)

pytestmark = pytest.mark.unit
T0 = datetime(2026, 1, 1, tzinfo=UTC)
WINDOW = timedelta(hours=1)
POLICY = Policy(budget=2, window=WINDOW)
MATMUL = frozenset({"matmul"})


def ago(seconds: float) -> datetime:
    return T0 - timedelta(seconds=seconds)


def replaced(node: str, seconds_ago: float, tests=MATMUL) -> Replacement:
    return Replacement(node, ago(seconds_ago), frozenset(tests))


def failed(node: str = "n9", *, tests=MATMUL, replace: bool = True, joined_ago: float | None = 3600 * 24):
    return NodeFailed(node, frozenset(tests), replace, None if joined_ago is None else ago(joined_ago))


def test_a_replacement_within_budget_proceeds_and_is_counted():
    d = decide(Guard("g"), failed(), T0, POLICY)
    assert d.verdict is Verdict.PROCEED and d.guard.replacements == (Replacement("n9", T0, MATMUL),)


def test_a_failure_with_reboots_left_proceeds_and_counts_nothing():
    g = Guard("g", (replaced("n1", 60),))
    d = decide(g, failed(replace=False), T0, POLICY)
    assert d == Decision(g, Verdict.PROCEED)


@pytest.mark.parametrize(("budget", "recent", "verdict"), [
    (0, 0, Verdict.TRIP), (1, 0, Verdict.PROCEED), (1, 1, Verdict.TRIP), (2, 1, Verdict.PROCEED),
    (2, 2, Verdict.TRIP), (3, 2, Verdict.PROCEED)], ids=lambda v: str(v))
def test_the_replacement_past_the_budget_trips_the_breaker(budget, recent, verdict):
    # Old nodes failing another test: only the budget can trip here.
    g = Guard("g", tuple(replaced(f"n{i}", 60 * (i + 1), tests={"membw"}) for i in range(recent)))
    d = decide(g, failed(), T0, Policy(budget, WINDOW))
    assert d.verdict is verdict
    if verdict is Verdict.TRIP:
        assert "replacement budget spent" in d.guard.alert.reason and d.guard.alert.since == T0
        assert d.guard.alert.nodes[-1] == "n9" and d.guard.replacements == g.replacements  # nothing counted


@pytest.mark.parametrize(("seconds_ago", "counts"), [(60, True), (3599, True), (3600, False), (7200, False)],
                         ids=["1 min", "just inside", "window edge", "2 h"])
def test_only_replacements_inside_the_window_count(seconds_ago, counts):
    g = Guard("g", (replaced("n1", seconds_ago, {"membw"}), replaced("n2", 30, {"membw"})))
    d = decide(g, failed(), T0, POLICY)
    assert d.verdict is (Verdict.TRIP if counts else Verdict.PROCEED)
    if not counts:  # what left the window is forgotten
        assert [r.node_id for r in d.guard.replacements] == ["n2", "n9"]


def test_a_clear_forgives_the_replacements_before_it():
    g = Guard("g", (replaced("n1", 60), replaced("n2", 30)), cleared_at=ago(10))
    assert decide(g, failed(), T0, POLICY).verdict is Verdict.PROCEED


@pytest.mark.parametrize("replace", [True, False], ids=["would be replaced", "would reboot"])
def test_a_successor_failing_the_test_its_predecessor_was_replaced_for_trips_the_breaker(replace):
    g = Guard("g", (replaced("n1", 600),))
    d = decide(g, failed("n9", tests={"matmul", "membw"}, replace=replace, joined_ago=300), T0, POLICY)
    assert d.verdict is Verdict.TRIP
    assert d.guard.alert == Alert("systemic failure: n9 joined after n1 was replaced and failed matmul again", T0,
                                  MATMUL, ("n1", "n9"))


@pytest.mark.parametrize(("tests", "joined_ago", "why"), [
    ({"membw"}, 300, "another test"), ({"matmul"}, 900, "joined before the replacement"),
    ({"matmul"}, None, "join time unknown")], ids=lambda v: str(v))
def test_no_same_test_verdict_without_a_successor_failing_the_same_test(tests, joined_ago, why):
    g = Guard("g", (replaced("n1", 600),))
    assert decide(g, failed(tests=tests, replace=False, joined_ago=joined_ago), T0, POLICY).verdict is Verdict.PROCEED


@pytest.mark.parametrize("replace", [True, False], ids=["would be replaced", "would reboot"])
def test_while_the_alert_stands_every_failure_is_held(replace):
    g = Guard("g", alert=Alert("systemic failure: x", ago(5)))
    assert decide(g, failed(replace=replace), T0, POLICY) == Decision(g, Verdict.HOLD,
                                                                     "the group's systemic-failure alert stands")


def test_clearing_drops_the_alert_and_starts_a_fresh_window():
    g = Guard("g", (replaced("n1", 60), replaced("n2", 30)), Alert("systemic failure: x", ago(5)))
    d = decide(g, Clear("ops"), T0, POLICY)
    assert d == Decision(Guard("g", (), None, T0), Verdict.PROCEED)
    assert decide(d.guard, failed(), T0 + timedelta(seconds=1), POLICY).verdict is Verdict.PROCEED


def test_clearing_a_group_without_alert_is_refused():
    assert decide(Guard("g"), Clear("ops"), T0, POLICY) == Refusal("group g has no systemic-failure alert")


def test_a_whole_group_failing_the_same_test_stops_at_the_budget():
    """The storm: every node fails matmul; each replacement's successor fails it too."""
    guard, verdicts = Guard("g"), []
    for i in range(6):
        d = decide(guard, failed(f"n{i}", joined_ago=86400), T0 + timedelta(seconds=30 * i), POLICY)
        guard = d.guard
        verdicts.append(d.verdict)
    assert verdicts == [Verdict.PROCEED, Verdict.PROCEED, Verdict.TRIP, Verdict.HOLD, Verdict.HOLD, Verdict.HOLD]
