"""Which queued jobs a placement pass considers (services/queue/tenancy/candidates.py): by share deficit, so an
organisation with many old queued jobs cannot hide a smaller one's from fair share; and the budget accounts a
pass builds from the budget service's answers, asked before it locks any row (services/queue/org_budgets.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.queue.org_budgets import Consumption, build_accounts
from services.queue.tenancy.candidates import choose
from services.queue.tenancy.model import Organisation
from tests.support.builders import candidate

pytestmark = pytest.mark.unit


def test_a_small_organisations_jobs_behind_a_big_ones_many_are_considered():
    big = [candidate(f"b{i}", "big", at=i) for i in range(1000)]
    small = [candidate(f"s{i}", "small", at=5000 + i) for i in range(3)]
    chosen = choose(big + small, 10)
    assert len(chosen) == 10 and {"s0", "s1", "s2"} <= set(chosen)
    # the oldest N alone (what a pass took before) would have been big's only
    assert sorted(big + small, key=lambda j: j.created_at)[:10] == big[:10]


def test_equal_organisations_holding_nothing_alternate_oldest_first():
    a = [candidate(f"a{i}", "a", at=i) for i in range(5)]
    b = [candidate(f"b{i}", "b", at=100 + i) for i in range(5)]
    assert choose(a + b, 4) == ["a0", "b0", "a1", "b1"]


def test_an_organisation_holding_devices_gets_fewer_places_and_weight_gives_more():
    a = [candidate(f"a{i}", "a", at=i) for i in range(10)]
    b = [candidate(f"b{i}", "b", at=i + 0.5) for i in range(10)]
    held = choose(a + b, 6, held={"a": 2})
    assert sum(j.startswith("a") for j in held) == 2 and sum(j.startswith("b") for j in held) == 4
    weighted = choose(a + b, 6, weights={"b": 2.0})
    assert sum(j.startswith("b") for j in weighted) == 4


def test_within_an_organisation_higher_priority_then_older_first():
    jobs = [candidate("old", "a", at=0), candidate("urgent", "a", at=10, priority=5), candidate("new", "a", at=20)]
    assert choose(jobs, 2) == ["urgent", "old"]


def test_a_big_job_counts_for_its_devices():
    jobs = [candidate("gang", "a", at=0, devices=8), candidate("a1", "a", at=1), candidate("b0", "b", at=5),
            candidate("b1", "b", at=6)]
    assert choose(jobs, 3) == ["b0", "b1", "gang"]


def test_all_when_fewer_than_the_limit_and_none_for_no_places():
    jobs = [candidate("a", "x", at=0), candidate("b", "y", at=1)]
    assert sorted(choose(jobs, 5)) == ["a", "b"] and choose(jobs, 0) == []


queues = st.lists(st.tuples(st.sampled_from("abcde"), st.integers(0, 1000), st.integers(-2, 2),
                            st.integers(1, 4)), max_size=80)


@settings(max_examples=200, deadline=None)
@given(queues, st.integers(1, 40))
def test_every_organisation_with_queued_jobs_gets_its_fair_part_of_the_places(rows, limit):
    jobs = [candidate(f"j{i}", org, at=at, priority=prio, devices=1) for i, (org, at, prio, _) in enumerate(rows)]
    chosen = choose(jobs, limit)
    assert len(chosen) == len(set(chosen)) == min(limit, len(jobs))
    orgs = {j.org for j in jobs}
    for org in orgs:
        mine = [j for j in jobs if j.org == org]
        got = [j for j in chosen if j in {m.job_id for m in mine}]
        assert len(got) >= min(len(mine), limit // len(orgs))
        # the organisation's own order is kept: what it gets is its first jobs
        ordered = [m.job_id for m in sorted(mine, key=lambda m: (-m.priority, m.created_at, m.job_id))]
        assert set(got) == set(ordered[:len(got)])


def queued(job_id: str, org: str, ceiling: float):
    return SimpleNamespace(id=job_id, org=org, gpu_ceiling_seconds=ceiling)


def test_accounts_from_the_answers_asked_before_the_pass():
    orgs = {"lab": Organisation("lab", budget_gpu_seconds=1000.0), "free": Organisation("free")}
    answers = Consumption(True, frozenset({"lab"}), {"lab": 300.0}, {"r1": 50.0, "q1": 20.0})
    running = [{"id": "r1", "org": "lab", "ceiling": 200.0}, {"id": "r2", "org": "lab", "ceiling": 100.0},
               {"id": "x", "org": "free", "ceiling": 10.0}]
    accounts, needs, unknown = build_accounts(orgs, answers, running,
                                              [queued("q1", "lab", 100.0), queued("q2", "free", 5.0)])
    lab = accounts["lab"]
    # r2 started after the question: it counts as having used nothing (its whole ceiling reserved)
    assert (lab.consumed, dict(lab.reservations), lab.available) == (300.0, {"r1": 150.0, "r2": 100.0}, 450.0)
    assert needs == {"q1": 80.0} and unknown == set() and "free" not in accounts


def test_budgeted_organisations_the_answers_do_not_cover_wait():
    orgs = {"lab": Organisation("lab", budget_gpu_seconds=1000.0), "new": Organisation("new", budget_gpu_seconds=5.0)}
    covered = Consumption(True, frozenset({"lab"}), {}, {})
    assert build_accounts(orgs, covered, [], [])[2] == {"new"}
    assert build_accounts(orgs, Consumption(answered=False), [], [])[2] == {"lab", "new"}
