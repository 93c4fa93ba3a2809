"""The placement (services/queue/tenancy/placement.py ``plan``, the one the scheduler runs) as a fit of jobs to
executors: fit by GPU count, the smallest fitting free node, every executor granted once, gangs all or nothing and
in one node group, a job that cannot start passed by one that can, first come first served among equals.

Quotas, fair share, budgets and reclaim are in test_tenancy_rules.py; here one unmetered organisation has the
fleet to itself. Executors gone silent never reach the planner: the snapshot query leaves them out
(tests/integration/test_placement_statements.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.queue.tenancy.model import Pending
from services.queue.tenancy.placement import plan
from services.queue.tenancy.placement_types import Admit, Node, Plan, WaitCode, smallest
from tests.support.builders import ORG, executor_node, pending, snapshot

pytestmark = pytest.mark.unit


def place(jobs: list[Pending], nodes: list[Node]) -> Plan:
    return plan(snapshot(nodes=nodes, pending=jobs))


def granted(result: Plan) -> dict[str, tuple[str, ...]]:
    return {a.job_id: a.workers for a in result.admitted}


@pytest.mark.parametrize(("need", "have", "fit"), [
    (0, 0, True), (0, 8, True), (1, 0, False), (1, 1, True), (4, 2, False), (4, 8, True),
], ids=lambda v: str(v))
def test_an_executor_fits_when_it_has_enough_gpus(need, have, fit):
    result = place([pending("j", gpus_per_worker=need)], [executor_node("e", gpus=have)])
    if fit:
        assert granted(result) == {"j": ("e",)} and not result.waiting
    else:
        assert not result.admitted
        wait = result.waiting["j"]
        assert wait.code is WaitCode.NO_READY_NODE and wait.numbers == {"gpus_per_worker": need}


def test_first_come_first_served_among_jobs_of_equal_priority():
    assert granted(place([pending("late", at=5), pending("early", at=1)], [executor_node("e")])) == {"early": ("e",)}


def test_priority_comes_before_age_and_the_id_breaks_a_tie():
    assert granted(place([pending("old", at=1), pending("urgent", at=5, priority=3)],
                         [executor_node("e")])) == {"urgent": ("e",)}
    assert granted(place([pending("b"), pending("a")], [executor_node("e")])) == {"a": ("e",)}


def test_every_free_executor_is_granted_once():
    result = place([pending("a", at=1), pending("b", at=2), pending("c", at=3)],
                   [executor_node("e1"), executor_node("e2")])
    assert [a.job_id for a in result.admitted] == ["a", "b"]
    assert len({w for a in result.admitted for w in a.workers}) == 2
    assert result.waiting["c"].code is WaitCode.BEHIND and result.waiting["c"].numbers["ahead"] == 2


def test_a_busy_executor_is_never_granted_but_counts_as_capacity():
    result = place([pending("j", gpus_per_worker=1)], [executor_node("busy", gpus=1, free=False)])
    assert not result.admitted and result.waiting["j"].code is WaitCode.BEHIND


def test_a_gang_gets_distinct_executors_or_none():
    result = place([pending("g", workers=3)], [executor_node("e1"), executor_node("e2")])
    assert not result.admitted and result.waiting["g"].code is WaitCode.GANG_CANNOT_FIT
    assert result.waiting["g"].numbers == {"workers": 3, "fitting_nodes": 2}
    (a,) = place([pending("g", workers=2)], [executor_node("e1"), executor_node("e2"), executor_node("e3")]).admitted
    assert len(set(a.workers)) == 2 and a.workers == ("e1", "e2")


def test_a_gang_is_placed_in_one_node_group():
    one_each = [executor_node("a1", group="a"), executor_node("b1", group="b")]
    assert place([pending("g", workers=2)], one_each).waiting["g"].code is WaitCode.GANG_CANNOT_FIT
    (a,) = place([pending("g", workers=2)], [*one_each, executor_node("b2", group="b")]).admitted
    assert a.group == "b" and a.workers == ("b1", "b2")


def test_a_gang_that_cannot_fit_holds_nothing_back_from_later_jobs():
    result = place([pending("g", at=1, workers=3), pending("small", at=2)], [executor_node("e1"), executor_node("e2")])
    assert granted(result) == {"small": ("e1",)}


def test_a_gang_waiting_for_busy_nodes_is_passed_by_a_job_that_fits_now():
    nodes = [executor_node("e1"), executor_node("e2", free=False)]
    result = place([pending("g", at=1, workers=2), pending("small", at=2)], nodes)
    assert granted(result) == {"small": ("e1",)} and result.waiting["g"].code is WaitCode.BEHIND


def test_the_smallest_fitting_executor_is_taken_so_big_nodes_stay_for_big_jobs():
    result = place([pending("cpu", at=1, gpus_per_worker=0), pending("gpu", at=2, gpus_per_worker=4)],
                   [executor_node("big", gpus=8), executor_node("cpu-node", gpus=0)])
    assert granted(result) == {"cpu": ("cpu-node",), "gpu": ("big",)}


def test_among_nodes_of_one_size_the_id_decides():
    fleet = [executor_node("z", gpus=2), executor_node("a", gpus=2), executor_node("m", gpus=4)]
    assert granted(place([pending("j", gpus_per_worker=2)], fleet)) == {"j": ("a",)}


def test_a_worker_holds_its_whole_node_and_a_cpu_only_one_counts_as_one_device():
    result = place([pending("j", gpus_per_worker=1), pending("c", at=1)],
                   [executor_node("n8", gpus=8), executor_node("n0", gpus=0)])
    devices = {a.job_id: a.devices for a in result.admitted}
    assert devices == {"j": 8, "c": 1}


def test_nothing_to_place():
    assert place([], [executor_node("e")]).admitted == []
    empty = place([pending("j")], [])
    assert empty.admitted == [] and empty.waiting["j"].code is WaitCode.NO_READY_NODE


# -- the same rules on any fleet and queue -------------------------------------------------------------------

fleets = st.lists(st.tuples(st.sampled_from([0, 1, 2, 4, 8]), st.sampled_from(["a", "b"]), st.booleans()),
                  max_size=10)
queues = st.lists(st.tuples(st.integers(1, 3), st.sampled_from([0, 1, 2, 4, 8]), st.integers(0, 2)), max_size=12)


def _snapshot(fleet, queue) -> tuple[list[Node], list[Pending]]:
    nodes = [executor_node(f"n{i}", gpus=gpus, group=group, free=free) for i, (gpus, group, free) in enumerate(fleet)]
    jobs = [pending(f"j{i:02d}", at=i, workers=w, gpus_per_worker=g, priority=p) for i, (w, g, p) in enumerate(queue)]
    return nodes, jobs


@settings(max_examples=150, deadline=None)
@given(fleets, queues)
def test_every_grant_is_free_fitting_distinct_whole_and_in_one_group(fleet, queue):
    nodes, jobs = _snapshot(fleet, queue)
    result = place(jobs, nodes)
    by_id = {n.executor_id: n for n in nodes}
    shape = {j.job_id: j for j in jobs}
    used: list[str] = []
    for a in result.admitted:
        want = shape[a.job_id]
        assert len(a.workers) == want.workers  # all or nothing
        assert all(by_id[e].free and by_id[e].gpus >= want.gpus_per_worker for e in a.workers)
        assert {by_id[e].group for e in a.workers} == {a.group}
        used += a.workers
    assert len(used) == len(set(used))
    assert set(result.waiting) | {a.job_id for a in result.admitted} == set(shape)


@settings(max_examples=150, deadline=None)
@given(fleets, queues)
def test_no_job_waits_for_a_node_that_is_left_free_and_grants_take_the_smallest(fleet, queue):
    nodes, jobs = _snapshot(fleet, queue)
    result = place(jobs, nodes)
    taken = {e for a in result.admitted for e in a.workers}
    left = [n for n in nodes if n.free and n.executor_id not in taken]
    for j in jobs:
        if j.job_id in result.waiting:  # work-conserving: nothing left free in any group would have taken it
            for group in {n.group for n in nodes}:
                fitting = [n for n in left if n.group == group and n.gpus >= j.gpus_per_worker]
                assert len(fitting) < j.workers
    by_id = {n.executor_id: n for n in nodes}
    for a in result.admitted:  # nodes only leave the free list: a smaller fitting one left free was free then
        largest = max(smallest(by_id[e]) for e in a.workers)
        need = next(j.gpus_per_worker for j in jobs if j.job_id == a.job_id)
        assert not [n for n in left if n.group == a.group and n.gpus >= need and smallest(n) < largest]


def test_an_admission_says_where_and_in_what_order():
    (a,) = place([pending("j", gpus_per_worker=1)], [executor_node("e", gpus=1)]).admitted
    assert a == Admit("j", ORG, "g", ("e",), 0, 1, a.why, 0.0, 1)
