"""What each node transition asks of the provisioner (services/health/domain/provisioning.py), over every state
against every fact of the node lifecycle, and the Slurm provisioner's part that needs no Slurm."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from libs.contracts.nodes import NodeState
from services.health import slurm
from services.health.domain.nodes import (CheckRequested, ChecksDeferred, ChecksFailed, ChecksPassed, ChecksStarted,
                                          Drain, Hold, Policy, Registered, Release, Silent, Transition,
                                          Unaddressable, Undrain, decide)
from services.health.domain.provisioning import Action, Request, requests_for
from services.health.settings import HealthSettings
from tests.support.builders import node

pytestmark = pytest.mark.unit
T0 = datetime(2026, 1, 1, tzinfo=UTC)
S = NodeState
FAILED_MATMUL = [("matmul", {"reason": "wrong result"})]
FACTS = [Registered("n1", "e1", "g", "b2"), ChecksStarted("r1"), CheckRequested("r2", busy=False),
         CheckRequested("r2", busy=True), ChecksPassed("r1"), ChecksFailed("r1", "matmul: wrong result"),
         ChecksFailed("r1", "matmul: wrong result", hold="group alert"), ChecksDeferred("r1"), Drain("disk swap"),
         Undrain(), Hold("group alert"), Release(), Unaddressable("bad id"), Silent(30.0)]


def expected(state: NodeState, fact, reboots: int) -> list[Action]:
    """The rule, stated independently of the code: a failed check drains and then reboots (or, past max_reboots,
    replaces; held by the breaker: neither); an operator's drain drains; a pass resumes. Nothing else asks."""
    if state is S.CHECKING and isinstance(fact, ChecksFailed):
        if fact.hold is not None:
            return [Action.DRAIN]
        return [Action.DRAIN, Action.REPLACE if reboots >= 1 else Action.REBOOT]
    if state is S.CHECKING and isinstance(fact, ChecksPassed):
        return [Action.RESUME]
    if isinstance(fact, Drain) and state not in (S.REPLACED, S.DRAINED):
        return [Action.DRAIN]
    return []


@pytest.mark.parametrize("reboots", [0, 1], ids=["first-failure", "after-a-reboot"])
@pytest.mark.parametrize("fact", FACTS, ids=lambda f: type(f).__name__ + (f".{f.hold}" if getattr(f, "hold", None)
                                                                           else ".busy" if getattr(f, "busy", False)
                                                                           else ""))
@pytest.mark.parametrize("state", list(NodeState), ids=str)
def test_each_transition_asks_the_provisioner_what_the_rule_says(state, fact, reboots):
    held = "group alert" if state is S.FAILED else None
    t = decide(node(state, reboots=reboots, held=held), fact, T0, Policy(max_reboots=1))
    asked = requests_for(t, failed=FAILED_MATMUL, hostname="gpu-07", slurm_job_id="42") if isinstance(
        t, Transition) else []
    assert [r.action for r in asked] == expected(state, fact, reboots)
    for r in asked:
        assert (r.node_id, r.group, r.executor_id, r.hostname, r.slurm_job_id) == ("n1", "g", "e1", "gpu-07", "42")


def test_the_drain_reason_is_the_failed_figures_and_the_operators_words():
    t = decide(node(S.CHECKING), ChecksFailed("r1", "membw: slow"), T0)
    slow = [("membw", {"comparisons": [{"metric": "copy_gbps", "value": 1.0, "reference": 8.0, "ok": False,
                                        "source": "group median of 3"}]})]
    drain, reboot = requests_for(t, failed=slow)
    assert drain.reason == "teto: membw copy_gbps 1 vs median 8"
    assert reboot.reason.startswith("teto: reboot 1: membw: slow")
    [operator] = requests_for(decide(node(S.READY), Drain("disk swap"), T0))
    assert operator.reason == "teto: drained: disk swap"
    unexplained, _ = requests_for(t)  # no verdicts at hand: the failure's own reason
    assert unexplained.action is Action.DRAIN and unexplained.reason == "teto: membw: slow"


def test_a_request_is_what_the_command_hook_formats():
    r = Request(Action.REPLACE, "n1", "g", "e1", "why", "h", "42")
    assert "{node_id} {group} {executor_id}".format(**r.as_dict()) == "n1 g e1"
    assert r.as_dict()["action"] == "replace"


def test_the_slurm_provisioner_leaves_a_node_that_is_no_pilot_alone():
    cfg = HealthSettings.from_env(env={}, slurm_pilot_dir="/nowhere")
    for action in Action:
        assert asyncio.run(slurm.act(cfg, Request(action, "n1", "g", "e1", "r", hostname="h"))) is None
    reboot = Request(Action.REBOOT, "n1", "g", "e1", "r", hostname="h", slurm_job_id="42")
    assert asyncio.run(slurm.act(cfg, reboot)) is None  # TETO_SLURM_REBOOT off: the agent restarts, Slurm is not asked
