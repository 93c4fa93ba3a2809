"""Nodes under their group's systemic-failure alert (held), released when it is cleared, and nodes that
cannot be addressed on the bus: every state against each of these facts."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from libs.contracts.nodes import NodeEventKind, NodeState
from services.health.domain.nodes import (ChecksFailed, ChecksPassed, Hold, Policy, Release, ScheduleChecks,
                                          Transition, Unaddressable, decide)
from tests.support.builders import node

pytestmark = pytest.mark.unit
T0 = datetime(2026, 1, 1, tzinfo=UTC)
S = NodeState
ALL = list(NodeState)
WHY = "systemic failure: n2 joined after n1 was replaced and failed matmul again"


@pytest.mark.parametrize("state", ALL, ids=str)
def test_an_alert_holds_every_node_still_in_the_group_out_of_scheduling(state):
    t = decide(node(state), Hold(WHY), T0)
    if state in (S.REPLACED, S.DRAINED):
        assert not t.changed and t.node.held is None
        return
    assert t.node.held == WHY and t.node.state is state and not t.node.schedulable and not t.effects
    assert [(e.kind, e.reason) for e in t.events] == [(NodeEventKind.HELD, WHY)]
    if state is S.READY:
        assert t.node.why_not_schedulable == WHY


def test_holding_a_held_node_changes_nothing():
    n = node(S.READY, held=WHY)
    assert decide(n, Hold("another"), T0) == Transition.unchanged(n, "already held")


@pytest.mark.parametrize("reboots,max_reboots", [(0, 2), (2, 2)], ids=["reboot left", "would be replaced"])
def test_a_held_failure_stays_failed_with_no_reboot_and_no_replacement(reboots, max_reboots):
    t = decide(node(S.CHECKING, reboots=reboots), ChecksFailed("r1", "matmul: wrong", hold=WHY), T0,
               Policy(max_reboots))
    assert t.node.state is S.FAILED and t.node.held == WHY and not t.effects and t.node.reboots == reboots
    assert [e.kind for e in t.events] == [NodeEventKind.FAILED] and WHY in t.events[0].reason


def test_a_held_node_that_passes_is_ready_but_still_held():
    t = decide(node(S.CHECKING, held=WHY), ChecksPassed("r1"), T0)
    assert t.node.state is S.READY and not t.node.schedulable and t.node.why_not_schedulable == WHY


@pytest.mark.parametrize("state", ALL, ids=str)
def test_release_returns_ready_nodes_to_work_and_checks_failed_ones_again(state):
    t = decide(node(state, held=WHY, reboots=1), Release(), T0)
    assert t.node.held is None
    if state is S.FAILED:
        assert t.node.state is S.JOINING and t.effects == (ScheduleChecks(),) and t.node.reboots == 1
        assert [e.kind for e in t.events] == [NodeEventKind.JOINING]
    else:
        assert t.node.state is state and not t.effects
        assert [e.kind for e in t.events] == [NodeEventKind.RELEASED]
        assert t.node.schedulable is (state is S.READY)


def test_releasing_a_node_that_is_not_held_changes_nothing():
    n = node(S.READY)
    assert decide(n, Release(), T0) == Transition.unchanged(n, "not held")


@pytest.mark.parametrize("state", ALL, ids=str)
def test_a_node_that_cannot_be_addressed_is_failed_with_the_reason_and_never_rebooted(state):
    t = decide(node(state, cordoned=state is S.READY), Unaddressable("cannot be checked: bad id"), T0)
    if state in (S.REPLACED, S.DRAINED, S.FAILED):
        assert not t.changed
        return
    assert t.node.state is S.FAILED and t.node.reason == "cannot be checked: bad id" and not t.effects
    assert not t.node.schedulable and t.node.run_id is None and not t.node.cordoned


# -- an agent silent for the node-gone time ----------------------------------------------------------------

@pytest.mark.parametrize(("registered_ago", "beat_ago", "silent"), [
    (None, None, False), (10, None, False), (60, None, True), (60, 70, True), (60, 30, False), (600, 1, False),
    (600, 60, True), (600, 59, False)],
    ids=["never heard from", "young", "bare registration", "beats only before it", "beating", "long-lived",
         "beat then stopped", "beat just inside"])
def test_an_agent_heard_from_by_neither_registration_nor_heartbeat_for_the_timeout_is_silent(registered_ago,
                                                                                               beat_ago, silent):
    from datetime import timedelta

    from services.health.domain.liveness import silent as is_silent

    def ago(s):
        return None if s is None else T0 - timedelta(seconds=s)

    assert is_silent(ago(registered_ago), ago(beat_ago), T0, timedelta(seconds=60)) is silent


@pytest.mark.parametrize("state", ALL, ids=str)
def test_a_silent_node_is_gone_never_schedulable_and_back_when_it_registers_again(state):
    from services.health.domain.nodes import Registered, Silent

    t = decide(node(state), Silent(60), T0)
    if state in (S.REPLACED, S.DRAINED, S.GONE):
        assert not t.changed
        return
    assert t.node.state is S.GONE and not t.node.schedulable and not t.effects and t.node.run_id is None
    assert [(e.kind, e.reason) for e in t.events] == [(NodeEventKind.GONE, "gone: no heartbeat for 60s")]
    back = decide(t.node, Registered("n1", "e1", "g", "b9"), T0)
    assert back.node.state is S.JOINING and back.effects == (ScheduleChecks(),)
