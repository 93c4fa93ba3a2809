"""Placement by Python environment (issue 27): a job naming an environment is granted (every worker of a gang)
only to nodes whose executor offers it, waits with ``no_environment`` when no ready node does, and a job naming
none goes anywhere. The rule (tenancy/environments.py) and the admission pass that applies it."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from services.gateway.panel import words
from services.queue.tenancy import environments as envs
from services.queue.tenancy.placement import plan
from services.queue.tenancy.placement_types import Admit, Node, Snapshot, WaitCode
from services.queue.tenancy.model import Cohort, GroupQuota, Organisation, Pending, Running
from tests.support.builders import executor_node, pending

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ENV, OTHER = "/opt/teto/env", "/opt/conda/envs/x"
A = Organisation("a")  # unmetered: only the nodes decide


def job(job_id: str, environment: str | None = ENV, gpus: int = 1, org: str = "a", **overrides) -> Pending:
    """This file's job: one worker of one GPU in organisation ``a``, naming ``ENV``."""
    return pending(job_id, org, since=T0, environment=environment, gpus_per_worker=gpus, **overrides)


def node(executor: str, *offered: str, gpus: int = 1, **overrides) -> Node:
    """This file's node: one GPU."""
    return executor_node(executor, *offered, gpus=gpus, **overrides)


def placed(snap: Snapshot) -> dict[str, tuple[str, ...]]:
    return {a.job_id: a.workers for a in plan(snap).admitted}


# -- the rule ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("offered", "environment", "ok"), [
    ((), None, True),  # naming none: any node, even one offering nothing
    ((ENV,), None, True),
    ((ENV,), ENV, True),
    ((OTHER, ENV), ENV, True),
    ((), ENV, False),
    ((OTHER,), ENV, False),
    ((ENV + "/sub",), ENV, False),  # names compare whole, never as prefixes
    (("/opt/teto",), ENV, False),
])
def test_a_node_offers_a_job_its_environment_only_when_it_lists_it(offered, environment, ok):
    assert envs.offers(frozenset(offered), environment) is ok


def test_pick_takes_the_next_nodes_for_a_job_naming_none():
    free = [node("a"), node("b"), node("c")]
    assert envs.pick(free, 1, 2, None) == range(1, 3)
    assert envs.pick(free, 2, 2, None) == range(2, 3)  # too few: the caller sees fewer than asked
    assert envs.pick(free, 3, 1, None) == range(3, 3)


def test_pick_skips_the_nodes_without_the_environment_from_the_first_fitting_one():
    free = [node("a", ENV), node("b"), node("c", OTHER), node("d", ENV), node("e", ENV, OTHER), node("f", ENV)]
    assert envs.pick(free, 0, 2, ENV) == [0, 3]
    assert envs.pick(free, 1, 2, ENV) == [3, 4]  # never before ``start`` (those have too few GPUs)
    assert envs.pick(free, 0, 9, ENV) == [0, 3, 4, 5]
    assert envs.pick(free, 0, 1, OTHER) == [2]
    assert envs.pick(free, 0, 1, "/nowhere") == []


@pytest.mark.parametrize("picked", [range(1, 3), [1, 2], [0, 3], [3], []])
def test_remove_drops_exactly_the_picked_nodes(picked):
    free = [node(x) for x in "abcd"]
    kept = [n for i, n in enumerate(free) if i not in set(picked)]
    envs.remove(free, picked)
    assert free == kept


def test_the_missing_reason_names_the_environment_and_the_fix():
    reason = envs.missing_reason(ENV)
    assert ENV in reason and "teto env create" in reason and "TETO_ENVIRONMENTS" in reason


# -- the admission pass -----------------------------------------------------------------------------------

def test_a_job_naming_an_environment_is_granted_only_to_a_node_offering_it():
    # n-1 comes first for a job naming none (same GPUs, smaller id); the job naming ENV skips it.
    nodes = [node("n-1"), node("n-2", ENV)]
    assert placed(Snapshot({"a": A}, nodes, [job("j")])) == {"j": ("n-2",)}
    assert placed(Snapshot({"a": A}, nodes, [job("j", None)])) == {"j": ("n-1",)}


def test_a_job_naming_none_goes_anywhere_as_before():
    nodes = [node("n-1", OTHER), node("n-2")]
    assert placed(Snapshot({"a": A}, nodes, [job("j", None), job("k", None, at=1)])) == {
        "j": ("n-1",), "k": ("n-2",)}


def test_every_worker_of_a_gang_goes_to_a_node_offering_its_environment():
    nodes = [node("n-1", ENV), node("n-2"), node("n-3", ENV), node("n-4", OTHER), node("n-5", ENV)]
    assert placed(Snapshot({"a": A}, nodes, [job("gang", workers=3)])) == {"gang": ("n-1", "n-3", "n-5")}


def test_a_gang_that_would_need_a_node_without_its_environment_waits():
    nodes = [node("n-1", ENV), node("n-2"), node("n-3", ENV, free=False)]
    result = plan(Snapshot({"a": A}, nodes, [job("gang", workers=2)]))
    assert result.admitted == [] and result.waiting["gang"].code is WaitCode.BEHIND
    # Only one ready node offers it at all: the gang can never fit as it is.
    result = plan(Snapshot({"a": A}, nodes[:2], [job("gang", workers=2)]))
    assert result.waiting["gang"].code is WaitCode.GANG_CANNOT_FIT
    assert result.waiting["gang"].numbers == {"workers": 2, "fitting_nodes": 1}


def test_with_no_ready_node_offering_it_the_job_waits_saying_so():
    result = plan(Snapshot({"a": A}, [node("n-1"), node("n-2", OTHER)], [job("j")]))
    assert result.admitted == []
    wait = result.waiting["j"]
    assert wait.code is WaitCode.NO_ENVIRONMENT and wait.reason == envs.missing_reason(ENV)
    # The panel says it in Portuguese (the pattern reads the producer's sentence).
    said = words.waiting({"code": wait.code.value, "reason": wait.reason}, "pt-BR")
    assert said is not None and said.startswith(f"nenhum nó pronto oferece o ambiente Python {ENV}")


def test_a_busy_node_offering_it_makes_the_job_wait_behind_not_missing():
    result = plan(Snapshot({"a": A}, [node("n-1"), node("n-2", ENV, free=False)], [job("j")]))
    assert result.admitted == [] and result.waiting["j"].code is WaitCode.BEHIND


def test_no_node_offering_it_has_the_gpus():
    nodes = [node("big", gpus=8), node("small", ENV, gpus=1)]
    wait = plan(Snapshot({"a": A}, nodes, [job("j", gpus=4)])).waiting["j"]
    assert wait.code is WaitCode.NO_READY_NODE
    assert wait.reason == f"no ready node offering the Python environment {ENV} has 4 GPUs"
    assert words.waiting({"code": wait.code.value, "reason": wait.reason}, "pt-BR") == (
        f"nenhum nó pronto que oferece o ambiente Python {ENV} tem 4 GPUs")
    # Without an environment the big node takes it.
    assert placed(Snapshot({"a": A}, nodes, [job("j", None, gpus=4)])) == {"j": ("big",)}


def test_the_smallest_offering_node_with_enough_gpus_is_taken():
    nodes = [node("g1", ENV, gpus=1), node("g2", gpus=2), node("g4", ENV, gpus=4), node("g8", ENV, gpus=8)]
    assert placed(Snapshot({"a": A}, nodes, [job("j", gpus=2)])) == {"j": ("g4",)}


def test_jobs_of_two_environments_and_none_share_a_group_without_taking_each_others_nodes():
    nodes = [node("n-1", ENV), node("n-2", OTHER), node("n-3")]
    pending = [job("none", None, at=0), job("env", ENV, at=1), job("other", OTHER, at=2)]
    # The job naming none comes first and takes the first free node, n-1: the one ENV needed.
    result = plan(Snapshot({"a": A}, nodes, pending))
    assert {a.job_id: a.workers for a in result.admitted} == {"none": ("n-1",), "other": ("n-2",)}
    assert result.waiting["env"].code is WaitCode.BEHIND
    # Once n-1 is the only one offering ENV and free, ENV's job takes it, never n-3.
    assert placed(Snapshot({"a": A}, nodes, pending[1:])) == {"env": ("n-1",), "other": ("n-2",)}


def test_a_job_whose_environment_is_missing_does_not_make_the_next_job_of_the_same_shape_wait():
    # The pass remembers a wait per organisation and shape until something is admitted: the environment is
    # part of that shape, so a job of another environment (or none) behind it is still placed.
    nodes = [node("n-1", ENV), node("n-2")]
    pending = [job("missing", OTHER, at=0), job("env", ENV, at=1), job("none", None, at=2)]
    result = plan(Snapshot({"a": A}, nodes, pending))
    assert {a.job_id: a.workers for a in result.admitted} == {"env": ("n-1",), "none": ("n-2",)}
    assert result.waiting["missing"].code is WaitCode.NO_ENVIRONMENT


def test_a_job_naming_an_environment_in_one_group_only_is_placed_there():
    nodes = [node("a-1", group="a100"), node("h-1", ENV, group="h100")]
    result = plan(Snapshot({"a": A}, nodes, [job("j")]))
    (admit,) = result.admitted
    assert isinstance(admit, Admit) and admit.group == "h100" and admit.workers == ("h-1",)


def test_quota_counts_the_offering_nodes_a_job_would_hold():
    # The smallest ready node offering ENV has 4 GPUs: that is what the job would hold, over a nominal of 2.
    org = Organisation("a", quotas={"g": GroupQuota(2)})
    nodes = [node("n-1", gpus=2), node("n-4", ENV, gpus=4)]
    result = plan(Snapshot({"a": org}, nodes, [job("j", gpus=2)]))
    assert result.admitted == [] and result.waiting["j"].code is WaitCode.QUOTA
    assert placed(Snapshot({"a": org}, nodes, [job("j", None, gpus=2)])) == {"j": ("n-1",)}


def _reclaim(victim_nodes: list[Node], free_nodes: list[Node]) -> dict:
    """b borrows 2 nodes of a's share; a's job naming ENV reclaims."""
    a = Organisation("a", cohort="c", quotas={"g": GroupQuota(2)})
    b = Organisation("b", cohort="c", quotas={"g": GroupQuota(0, borrowing_limit=4)})
    nodes = [*victim_nodes, *free_nodes]
    running = [Running(f"r-{n.executor_id}", "b", "g", 1, 0, T0, (n.executor_id,)) for n in victim_nodes]
    result = plan(Snapshot({"a": a, "b": b}, nodes, [job("j")], running, {"c": Cohort("c")}))
    return {"preempted": sorted(p.job_id for p in result.preempted), "wait": result.waiting.get("j")}


def test_a_reclaim_for_a_job_naming_an_environment_frees_a_node_offering_it():
    # r-n-1 comes first by the usual order, but runs on a node without ENV: stopping it would free quota, not a
    # node the job can use, so only the borrower on the node offering ENV is preempted.
    found = _reclaim([node("n-1", free=False), node("n-2", ENV, free=False)], [])
    assert found["preempted"] == ["r-n-2"] and found["wait"].code is WaitCode.RECLAIMING
    assert _reclaim([node("n-1", free=False), node("n-2", ENV, free=False)], [node("n-3", ENV)])["preempted"] == [
        "r-n-1"]  # a free node offers it: only quota is missing, the usual order decides


def test_no_preemption_when_no_victim_frees_a_node_offering_the_environment():
    found = _reclaim([node("n-1", OTHER, free=False), node("n-2", free=False)], [node("n-3", ENV, free=False)])
    assert found["preempted"] == []
