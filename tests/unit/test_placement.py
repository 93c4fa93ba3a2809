"""The placement (services/queue/tenancy/placement.py ``plan``, the one the scheduler runs) as a fit of jobs to
executors: fit by GPU count, the smallest fitting free node, every executor granted once, gangs all or nothing and
in one node group, a job that cannot start passed by one that can, first come first served among equals.

Quotas, fair share, budgets and reclaim are in test_tenancy_rules.py; here one unmetered organisation has the
fleet to itself. Executors gone silent never reach the planner: the snapshot query leaves them out
(tests/integration/test_placement_statements.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.queue.tenancy.model import Organisation, Pending
from services.queue.tenancy.placement import plan
from services.queue.tenancy.placement_types import Admit, Node, Plan, Snapshot, WaitCode, smallest

pytestmark = pytest.mark.unit

T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
ORG = "o"


def job(job_id: str, at: int = 0, workers: int = 1, gpus: int = 0, priority: int = 0) -> Pending:
    return Pending(job_id, ORG, T0 + timedelta(seconds=at), workers, gpus, priority)


def node(executor_id: str, gpus: int = 0, group: str = "g", free: bool = True) -> Node:
    return Node(executor_id, group, gpus, free)


def place(jobs: list[Pending], nodes: list[Node]) -> Plan:
    return plan(Snapshot({ORG: Organisation(ORG)}, nodes, jobs))


def granted(result: Plan) -> dict[str, tuple[str, ...]]:
    return {a.job_id: a.workers for a in result.admitted}


@pytest.mark.parametrize(("need", "have", "fit"), [
    (0, 0, True), (0, 8, True), (1, 0, False), (1, 1, True), (4, 2, False), (4, 8, True),
], ids=lambda v: str(v))
def test_an_executor_fits_when_it_has_enough_gpus(need, have, fit):
    result = place([job("j", gpus=need)], [node("e", gpus=have)])
    if fit:
        assert granted(result) == {"j": ("e",)} and not result.waiting
    else:
        assert not result.admitted
        wait = result.waiting["j"]
        assert wait.code is WaitCode.NO_READY_NODE and wait.numbers == {"gpus_per_worker": need}


def test_first_come_first_served_among_jobs_of_equal_priority():
    assert granted(place([job("late", at=5), job("early", at=1)], [node("e")])) == {"early": ("e",)}


def test_priority_comes_before_age_and_the_id_breaks_a_tie():
    assert granted(place([job("old", at=1), job("urgent", at=5, priority=3)], [node("e")])) == {"urgent": ("e",)}
    assert granted(place([job("b"), job("a")], [node("e")])) == {"a": ("e",)}


def test_every_free_executor_is_granted_once():
    result = place([job("a", 1), job("b", 2), job("c", 3)], [node("e1"), node("e2")])
    assert [a.job_id for a in result.admitted] == ["a", "b"]
    assert len({w for a in result.admitted for w in a.workers}) == 2
    assert result.waiting["c"].code is WaitCode.BEHIND and result.waiting["c"].numbers["ahead"] == 2


def test_a_busy_executor_is_never_granted_but_counts_as_capacity():
    result = place([job("j", gpus=1)], [node("busy", gpus=1, free=False)])
    assert not result.admitted and result.waiting["j"].code is WaitCode.BEHIND


def test_a_gang_gets_distinct_executors_or_none():
    result = place([job("g", workers=3)], [node("e1"), node("e2")])
    assert not result.admitted and result.waiting["g"].code is WaitCode.GANG_CANNOT_FIT
    assert result.waiting["g"].numbers == {"workers": 3, "fitting_nodes": 2}
    (a,) = place([job("g", workers=2)], [node("e1"), node("e2"), node("e3")]).admitted
    assert len(set(a.workers)) == 2 and a.workers == ("e1", "e2")


def test_a_gang_is_placed_in_one_node_group():
    one_each = [node("a1", group="a"), node("b1", group="b")]
    assert place([job("g", workers=2)], one_each).waiting["g"].code is WaitCode.GANG_CANNOT_FIT
    (a,) = place([job("g", workers=2)], [*one_each, node("b2", group="b")]).admitted
    assert a.group == "b" and a.workers == ("b1", "b2")


def test_a_gang_that_cannot_fit_holds_nothing_back_from_later_jobs():
    result = place([job("g", 1, workers=3), job("small", 2)], [node("e1"), node("e2")])
    assert granted(result) == {"small": ("e1",)}


def test_a_gang_waiting_for_busy_nodes_is_passed_by_a_job_that_fits_now():
    nodes = [node("e1"), node("e2", free=False)]
    result = place([job("g", 1, workers=2), job("small", 2)], nodes)
    assert granted(result) == {"small": ("e1",)} and result.waiting["g"].code is WaitCode.BEHIND


def test_the_smallest_fitting_executor_is_taken_so_big_nodes_stay_for_big_jobs():
    result = place([job("cpu", 1, gpus=0), job("gpu", 2, gpus=4)], [node("big", gpus=8), node("cpu-node", gpus=0)])
    assert granted(result) == {"cpu": ("cpu-node",), "gpu": ("big",)}


def test_among_nodes_of_one_size_the_id_decides():
    assert granted(place([job("j", gpus=2)], [node("z", 2), node("a", 2), node("m", 4)])) == {"j": ("a",)}


def test_a_worker_holds_its_whole_node_and_a_cpu_only_one_counts_as_one_device():
    result = place([job("j", gpus=1), job("c", at=1)], [node("n8", gpus=8), node("n0", gpus=0)])
    devices = {a.job_id: a.devices for a in result.admitted}
    assert devices == {"j": 8, "c": 1}


def test_nothing_to_place():
    assert place([], [node("e")]).admitted == []
    empty = place([job("j")], [])
    assert empty.admitted == [] and empty.waiting["j"].code is WaitCode.NO_READY_NODE


# -- the same rules on any fleet and queue -------------------------------------------------------------------

fleets = st.lists(st.tuples(st.sampled_from([0, 1, 2, 4, 8]), st.sampled_from(["a", "b"]), st.booleans()),
                  max_size=10)
queues = st.lists(st.tuples(st.integers(1, 3), st.sampled_from([0, 1, 2, 4, 8]), st.integers(0, 2)), max_size=12)


def _snapshot(fleet, queue) -> tuple[list[Node], list[Pending]]:
    nodes = [node(f"n{i}", gpus, group, free) for i, (gpus, group, free) in enumerate(fleet)]
    jobs = [job(f"j{i:02d}", at=i, workers=w, gpus=g, priority=p) for i, (w, g, p) in enumerate(queue)]
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
    (a,) = place([job("j", gpus=1)], [node("e", 1)]).admitted
    assert a == Admit("j", ORG, "g", ("e",), 0, 1, a.why, 0.0, 1)
