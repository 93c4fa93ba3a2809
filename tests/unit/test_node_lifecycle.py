"""The node state machine, every state against every fact, and the recovery path to replacement."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from libs.contracts.nodes import NodeEventKind, NodeState
from services.health.domain.nodes import (CheckRequested, ChecksDeferred, ChecksFailed, ChecksPassed, ChecksStarted, Drain,
                                          Policy, Provision, Reboot, Refusal, Registered, ScheduleChecks,
                                          Transition, Undrain, decide, uncordon)
from tests.support.builders import node

pytestmark = pytest.mark.unit
T0 = datetime(2026, 1, 1, tzinfo=UTC)
S = NodeState
ALL = list(NodeState)


def reg(boot: str = "b2", executor: str = "e1") -> Registered:
    return Registered("n1", executor, "g", boot)


# -- registration ----------------------------------------------------------------------------------------------

def test_a_new_node_joins_and_asks_for_checks():
    t = decide(None, reg(), T0)
    assert isinstance(t, Transition)
    assert t.node.state is S.JOINING and not t.node.schedulable and t.node.node_id == "n1"
    assert [e.kind for e in t.events] == [NodeEventKind.JOINING]
    assert t.effects == (ScheduleChecks(),)


@pytest.mark.parametrize("state", [s for s in ALL if s not in (S.REPLACED, S.DRAINED)], ids=str)
def test_a_new_boot_of_a_known_node_is_checked_again(state):
    t = decide(node(state, reboots=1), reg(), T0)
    assert t.node.state is S.JOINING and t.effects == (ScheduleChecks(),) and t.node.run_id is None
    assert t.node.reboots == 1  # the count survives the reboot: it is what max_reboots limits


@pytest.mark.parametrize("state", [S.REPLACED, S.DRAINED], ids=str)
def test_a_replaced_or_drained_node_stays_so_when_its_agent_restarts(state):
    t = decide(node(state), reg(executor="e2"), T0)
    assert t.node.state is state and not t.events and not t.effects and t.node.executor_id == "e2"


@pytest.mark.parametrize("state", ALL, ids=str)
def test_the_same_boot_registering_again_changes_nothing(state):
    n = node(state)
    t = decide(n, reg(boot="b1"), T0)
    assert t == Transition.unchanged(n, "registration already seen")


# -- checks ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("state", ALL, ids=str)
def test_checks_start_only_on_joining_ready_or_checking_nodes(state):
    t = decide(node(state, run_id=None), ChecksStarted("r9"), T0)
    if state in (S.JOINING, S.READY, S.CHECKING):
        assert t.node.state is S.CHECKING and t.node.run_id == "r9" and not t.node.schedulable
        assert t.events[0].kind is NodeEventKind.CHECKING
    else:
        assert isinstance(t, Refusal) and str(state) in t.reason


@pytest.mark.parametrize("state", ALL, ids=str)
def test_passing_makes_a_checking_node_ready_and_resets_its_reboots(state):
    t = decide(node(state, reboots=2), ChecksPassed("r1"), T0)
    if state is S.CHECKING:
        assert t.node.state is S.READY and t.node.schedulable and t.node.reboots == 0
    else:
        assert not t.changed and t.node.state is state


def test_a_result_of_another_run_is_old_news():
    n = node(S.CHECKING)
    for fact in (ChecksPassed("old"), ChecksFailed("old", "x")):
        t = decide(n, fact, T0)
        assert not t.changed and t.ignored == "not checking under run old"


@pytest.mark.parametrize("reboots,max_reboots,expect", [
    (0, 2, S.RECOVERING), (1, 2, S.RECOVERING), (2, 2, S.REPLACED), (0, 0, S.REPLACED), (1, 1, S.REPLACED)],
    ids=lambda v: str(v))
def test_failing_reboots_until_max_reboots_then_replaces(reboots, max_reboots, expect):
    t = decide(node(S.CHECKING, reboots=reboots), ChecksFailed("r1", "matmul wrong"), T0, Policy(max_reboots))
    assert [e.kind.value for e in t.events] == ["failed", expect.value]
    assert t.node.state is expect and not t.node.schedulable
    if expect is S.RECOVERING:
        assert t.effects == (Reboot(reboots + 1, "matmul wrong"),) and t.node.reboots == reboots + 1
    else:
        assert len(t.effects) == 1 and isinstance(t.effects[0], Provision)
        assert "matmul wrong" in t.node.reason


@pytest.mark.parametrize("state", [s for s in ALL if s is not S.CHECKING], ids=str)
def test_failing_outside_checking_changes_nothing(state):
    t = decide(node(state, run_id="r1"), ChecksFailed("r1", "x"), T0)
    assert not t.changed and not t.effects


def test_the_whole_recovery_path_to_replacement():
    policy = Policy(max_reboots=1)
    t = decide(None, reg("b1"), T0)
    t = decide(t.node, ChecksStarted("r1"), T0)
    t = decide(t.node, ChecksFailed("r1", "bad"), T0, policy)
    assert t.node.state is S.RECOVERING and isinstance(t.effects[0], Reboot)
    t = decide(t.node, reg("b2"), T0)
    assert t.node.state is S.JOINING and t.events[0].reason == "back after a reboot"
    t = decide(t.node, ChecksStarted("r2"), T0)
    t = decide(t.node, ChecksFailed("r2", "bad again"), T0, policy)
    assert t.node.state is S.REPLACED and isinstance(t.effects[0], Provision)


# -- on-demand runs and cordons --------------------------------------------------------------------------------

@pytest.mark.parametrize("state", ALL, ids=str)
@pytest.mark.parametrize("busy", [True, False], ids=["busy", "idle"])
def test_an_on_demand_run_cordons_a_busy_ready_node_and_checks_an_idle_one(state, busy):
    t = decide(node(state, run_id=None), CheckRequested("r5", busy=busy), T0)
    if state is not S.READY:
        assert isinstance(t, Refusal)
    elif busy:
        assert t.node.cordoned and t.node.state is S.READY and not t.node.schedulable
        assert t.events[0].kind is NodeEventKind.CORDONED and t.node.why_not_schedulable.startswith("cordoned")
    else:
        assert t.effects == (ScheduleChecks(),) and not t.events


def test_a_cordoned_node_starts_its_checks_uncordoned_and_uncordon_returns_it_to_work():
    n = decide(node(S.READY), CheckRequested("r5", busy=True), T0).node
    started = decide(n, ChecksStarted("r5"), T0).node
    assert started.state is S.CHECKING and not started.cordoned
    back = uncordon(n, T0)
    assert back.node.schedulable and back.events[0].kind is NodeEventKind.UNCORDONED


# -- drain -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("state", ALL, ids=str)
def test_drain(state):
    t = decide(node(state), Drain("maintenance"), T0)
    if state is S.REPLACED:
        assert isinstance(t, Refusal)
    elif state is S.DRAINED:
        assert not t.changed
    else:
        assert t.node.state is S.DRAINED and t.node.reason == "maintenance" and not t.node.schedulable


@pytest.mark.parametrize("state", ALL, ids=str)
def test_undrain_rechecks_a_drained_node(state):
    t = decide(node(state, reboots=1), Undrain(), T0)
    if state is S.DRAINED:
        assert t.node.state is S.JOINING and t.effects == (ScheduleChecks(),) and t.node.reboots == 0
    else:
        assert isinstance(t, Refusal)


def test_facts_about_an_unknown_node_are_refused():
    assert isinstance(decide(None, Drain(), T0), Refusal)


@pytest.mark.parametrize("state", ALL, ids=str)
def test_only_ready_uncordoned_nodes_are_schedulable(state):
    assert node(state).schedulable is (state is S.READY)
    assert not node(state, cordoned=True).schedulable
    assert (node(state).why_not_schedulable is None) is (state is S.READY)


@pytest.mark.parametrize("state", ALL, ids=str)
def test_a_busy_answer_returns_a_checking_node_to_ready_cordoned(state):
    t = decide(node(state), ChecksDeferred("r1"), T0)
    if state is S.CHECKING:
        assert t.node.state is S.READY and t.node.cordoned and t.node.run_id == "r1" and not t.node.schedulable
        assert t.events[0].kind is NodeEventKind.CORDONED
    else:
        assert not t.changed
