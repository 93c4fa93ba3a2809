"""Tenancy rules by example: quotas and cohorts, fair share, budget reservations, waiting reasons, preemption."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.queue.tenancy import budget as budgets
from services.queue.tenancy import quota as quotas
from services.queue.tenancy.placement import plan
from services.queue.tenancy.placement_types import Node, Snapshot, WaitCode
from services.queue.tenancy.fairshare import dominant_share
from services.queue.tenancy.model import (
    Cohort, GroupQuota, Organisation, Pending, Preemption, Running, devices,
)
from tests.support.builders import executor_node, organisation, pending

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
G = "a100"


def org(name: str, nominal: int = 2, borrow: int | None = None, lend: int | None = None, cohort: str | None = "c",
        weight: float = 1.0, budget: float | None = None) -> Organisation:
    """This file's organisation: a share of ``a100`` in cohort ``c``."""
    return organisation(name, nominal=nominal, borrow=borrow, lend=lend, group=G, cohort=cohort, weight=weight,
                        budget_gpu_seconds=budget)


def job(job_id: str, org_name: str, at: int = 0, workers: int = 1, gpus: int = 1, priority: int = 0,
        needs: float = 0.0) -> Pending:
    """This file's job: one GPU a worker, reserving ``needs`` GPU-seconds."""
    return pending(job_id, org_name, at=at, since=T0, workers=workers, gpus_per_worker=gpus, priority=priority,
                   needs_gpu_seconds=needs)


def nodes(n: int, gpus: int = 1, group: str = G, busy: int = 0) -> list[Node]:
    """``n`` nodes of ``group``, the first ``busy`` of them busy."""
    return [executor_node(f"{group}-{i}", gpus=gpus, group=group, free=i >= busy) for i in range(n)]


def orgs(*items: Organisation) -> dict[str, Organisation]:
    return {o.name: o for o in items}


# -- model -------------------------------------------------------------------------------------------------

def test_a_cpu_only_worker_counts_as_one_device():
    assert devices(3, 0) == 3 and devices(2, 4) == 8


def test_lending_limit_splits_nominal_into_guaranteed_and_lendable():
    assert GroupQuota(4, lending_limit=1).guaranteed == 3
    assert GroupQuota(4).lendable == 4 and GroupQuota(4).guaranteed == 0
    assert GroupQuota(2, lending_limit=9).lendable == 2


def test_negative_limits_and_weights_are_refused():
    with pytest.raises(ValueError):
        GroupQuota(-1)
    with pytest.raises(ValueError):
        Organisation("x", weight=0)


# -- quotas ------------------------------------------------------------------------------------------------

def test_an_organisation_alone_never_borrows():
    a = org("a", nominal=2, borrow=5, cohort=None)
    assert quotas.check(a, G, 2, {}, orgs(a)).fits
    refused = quotas.check(a, G, 3, {}, orgs(a))
    assert refused.verdict is quotas.QuotaVerdict.AT_LIMIT
    assert "holds 0 of its 2 devices" in refused.reason and refused.numbers["job_devices"] == 3


def test_borrowing_is_bounded_by_the_borrowing_limit_and_the_pool():
    a, b = org("a", 2, borrow=1), org("b", 2)
    everyone = orgs(a, b)
    assert quotas.check(a, G, 3, {}, everyone).borrowing == 1
    assert quotas.check(a, G, 4, {}, everyone).verdict is quotas.QuotaVerdict.AT_LIMIT
    # b holds its whole share: nothing is idle to lend
    assert quotas.check(a, G, 3, {"b": {G: 2}}, everyone).verdict is quotas.QuotaVerdict.COHORT_FULL


def test_lending_limit_keeps_part_of_the_nominal_share_for_its_owner():
    a, b = org("a", 2, borrow=None), org("b", 4, lend=1)
    everyone = orgs(a, b)
    assert quotas.check(a, G, 3, {}, everyone).fits
    refused = quotas.check(a, G, 4, {}, everyone)
    assert refused.verdict is quotas.QuotaVerdict.COHORT_FULL and refused.numbers["pool"] == 3


def test_no_share_of_a_group_without_a_cohort_is_no_quota():
    a = Organisation("a", quotas={"h100": GroupQuota(2)})
    assert quotas.check(a, G, 1, {}, orgs(a)).verdict is quotas.QuotaVerdict.NO_QUOTA


def test_an_unmetered_organisation_is_bounded_only_by_the_fleet():
    free = Organisation("default")
    assert quotas.check(free, G, 10**6, {}, orgs(free)).fits


# -- fair share --------------------------------------------------------------------------------------------

def test_dominant_share_is_the_largest_group_share_over_the_weight():
    a = org("a", weight=2)
    share = dominant_share(a, {"a": {G: 2, "h100": 3}}, {G: 8, "h100": 4})
    assert share.group == "h100" and share.dominant == pytest.approx(0.375)
    assert "3 of 4 devices of node group h100 / weight 2" in share.explain()


def test_equal_organisations_alternate_and_a_double_weight_gets_twice_the_devices():
    a, b, c = org("a", 0, borrow=None), org("b", 0, borrow=None), org("c", 0, borrow=None, weight=2)
    pending = [job(f"{o}{i}", o, at=i) for o in "abc" for i in range(8)]
    # a pool needs lenders: a fourth member lends the whole group
    lender = org("z", 8)
    result = plan(Snapshot(orgs(a, b, c, lender), nodes(8), pending, cohorts={"c": Cohort("c")}))
    held = {o: sum(1 for x in result.admitted if x.org == o) for o in "abc"}
    assert held == {"a": 2, "b": 2, "c": 4}
    assert result.order[0].startswith("1. ")


def test_within_an_organisation_priority_then_age():
    a = org("a", 1, cohort=None)
    pending = [job("old", "a", at=0), job("urgent", "a", at=5, priority=3), job("new", "a", at=9)]
    result = plan(Snapshot(orgs(a), nodes(1), pending))
    assert [x.job_id for x in result.admitted] == ["urgent"]
    assert result.waiting["old"].code is WaitCode.QUOTA and result.waiting["new"].code is WaitCode.QUOTA


def test_jobs_within_nominal_come_before_borrowing_ones():
    # b holds nothing but wants to borrow; a is within nominal even though it already holds more.
    a, b = org("a", 3), org("b", 0, borrow=None)
    running = [Running("r", "a", G, 1, executors=(f"{G}-0",))]
    result = plan(Snapshot(orgs(a, b), nodes(4, busy=1), [job("b1", "b"), job("a1", "a", at=5)], running))
    assert result.admitted[0].job_id == "a1" and result.admitted[0].borrowing == 0
    assert result.admitted[1].job_id == "b1" and result.admitted[1].borrowing == 1


# -- budget ------------------------------------------------------------------------------------------------

def test_admission_reserves_the_remaining_ceiling_and_the_end_releases_the_rest():
    account = budgets.BudgetAccount("a", budget=10 * 3600)
    held = budgets.reserve(account, "j", 4 * 3600)
    assert isinstance(held, budgets.BudgetAccount) and held.available == 6 * 3600
    settled = budgets.settle(held, "j", 3600)
    assert settled.available == 9 * 3600 and settled.reserved == 0


def test_a_job_that_does_not_fit_the_budget_waits_with_the_numbers():
    a = org("a", 2, budget=5 * 3600)
    account = budgets.BudgetAccount("a", 5 * 3600, consumed=1.8 * 3600)
    result = plan(Snapshot(orgs(a), nodes(2), [job("j", "a", needs=5 * 3600)], budgets={"a": account}))
    wait = result.waiting["j"]
    assert wait.code is WaitCode.BUDGET
    assert wait.reason == "organisation budget: 3.2 GPU-h left, job needs 5.0 GPU-h"
    assert wait.numbers["available_gpu_seconds"] == pytest.approx(3.2 * 3600)


def test_admission_in_one_pass_reserves_for_each_job_in_turn():
    a = org("a", 4, budget=3 * 3600)
    pending = [job(f"j{i}", "a", at=i, needs=3600) for i in range(4)]
    result = plan(Snapshot(orgs(a), nodes(4), pending, budgets={"a": budgets.BudgetAccount("a", 3 * 3600)}))
    assert [x.job_id for x in result.admitted] == ["j0", "j1", "j2"]
    assert result.waiting["j3"].code is WaitCode.BUDGET and result.budgets["a"].available == 0


def test_a_requeue_whose_new_ceiling_can_never_fit_is_refused():
    account = budgets.BudgetAccount("a", 10 * 3600, consumed=8 * 3600, reservations={"j": 3600, "k": 3600})
    assert budgets.requeue_refusal(account, "j", 3600) is None
    refused = budgets.requeue_refusal(account, "j", 2 * 3600)
    assert refused is not None and refused.reason == ("organisation a budget: 1.0 GPU-h left, the new ceiling "
                                                      "needs 2.0 GPU-h")
    assert (refused.numbers["remaining_gpu_seconds"], refused.numbers["asked_gpu_seconds"],
            refused.numbers["reserved_gpu_seconds"]) == (3600, 2 * 3600, 3600)  # k's reservation, not j's own
    assert budgets.requeue_refusal(budgets.BudgetAccount("a", None), "j", 10**9) is None


def test_budget_period_starts():
    assert budgets.period_start("month", T0) == datetime(2026, 12, 1, tzinfo=UTC)
    assert budgets.period_start("day", T0 + timedelta(days=3)) == datetime(2026, 12, 4, tzinfo=UTC)
    with pytest.raises(ValueError):
        budgets.period_start("week", T0)


# -- waiting reasons ---------------------------------------------------------------------------------------

def test_no_ready_node_with_the_gpus():
    result = plan(Snapshot(orgs(org("a", 8)), nodes(2, gpus=1), [job("j", "a", gpus=4)]))
    assert result.waiting["j"].code is WaitCode.NO_READY_NODE and "4 GPUs" in result.waiting["j"].reason


def test_a_gang_larger_than_any_group_cannot_fit():
    result = plan(Snapshot(orgs(org("a", 8)), nodes(2) + nodes(2, group="h100"), [job("j", "a", workers=3)]))
    assert result.waiting["j"].code is WaitCode.GANG_CANNOT_FIT
    assert result.waiting["j"].numbers == {"workers": 3, "fitting_nodes": 2}


def test_no_quota_in_any_group():
    a = Organisation("a", quotas={"h100": GroupQuota(2)})
    result = plan(Snapshot(orgs(a), nodes(2), [job("j", "a")]))
    assert result.waiting["j"].code is WaitCode.NO_QUOTA


def test_behind_counts_the_jobs_ahead():
    a = org("a", 4, cohort=None)
    result = plan(Snapshot(orgs(a), nodes(4, busy=3), [job(f"j{i}", "a", at=i) for i in range(3)]))
    assert [x.job_id for x in result.admitted] == ["j0"]
    assert result.waiting["j2"].code is WaitCode.BEHIND and result.waiting["j2"].numbers["ahead"] == 2
    assert result.waiting["j2"].reason.startswith("behind 2 jobs of higher priority or fair share")


def test_an_unknown_organisation_waits():
    result = plan(Snapshot({}, nodes(1), [job("j", "ghost")]))
    assert result.waiting["j"].code is WaitCode.NO_ORGANISATION


# -- preemption of borrowed capacity -----------------------------------------------------------------------

def borrowed_fleet(policy: Preemption, victim_priority: int = 0):
    """4 nodes; b's nominal is 2 but it runs 4 jobs (2 borrowed from a); a now wants its 2 back."""
    a, b = org("a", 2), org("b", 2, borrow=None)
    running = [Running(f"b{i}", "b", G, 1, priority=victim_priority, admitted_at=T0 + timedelta(seconds=i),
                       executors=(f"{G}-{i}",)) for i in range(4)]
    pending = [job("a1", "a", at=10, priority=1), job("a2", "a", at=11, priority=1)]
    return Snapshot(orgs(a, b), nodes(4, busy=4), pending, running, cohorts={"c": Cohort("c", policy)})


def test_reclaim_preempts_the_newest_borrowed_jobs_only_as_many_as_needed():
    result = plan(borrowed_fleet(Preemption.RECLAIM_BORROWED))
    assert [p.job_id for p in result.preempted] == ["b3", "b2"]
    assert {p.for_org for p in result.preempted} == {"a"}
    assert "organisation b borrowed 1 devices" in result.preempted[0].reason
    assert result.waiting["a1"].code is WaitCode.RECLAIMING


def test_never_preempts_nothing():
    result = plan(borrowed_fleet(Preemption.NEVER))
    assert result.preempted == [] and result.waiting["a1"].code is WaitCode.QUOTA


@pytest.mark.parametrize(("victim_priority", "count"), [(0, 2), (1, 0), (5, 0)])
def test_by_priority_reclaims_only_lower_priority_jobs(victim_priority, count):
    result = plan(borrowed_fleet(Preemption.BY_PRIORITY, victim_priority))
    assert len(result.preempted) == count


def test_no_preemption_that_would_not_let_the_job_start():
    a, b = org("a", 2), org("b", 2, borrow=None)
    running = [Running("b0", "b", G, 1, executors=(f"{G}-0",)), Running("b1", "b", G, 1,
                                                                          executors=(f"{G}-1",)),
               Running("b2", "b", G, 1, executors=(f"{G}-2",))]
    # a's job needs 3 nodes of 1 GPU within its nominal 2: it cannot be reclaimed for
    result = plan(Snapshot(orgs(a, b), nodes(3, busy=3), [job("a1", "a", workers=3)], running,
                           cohorts={"c": Cohort("c")}))
    assert result.preempted == []


def test_a_job_already_stopping_for_a_reclaim_is_not_preempted_again_and_its_node_is_counted():
    snap = borrowed_fleet(Preemption.RECLAIM_BORROWED)
    running = [r if r.job_id != "b3" else Running("b3", "b", G, 1, admitted_at=r.admitted_at, executors=r.executors,
                                                   stopping=True) for r in snap.running]
    result = plan(Snapshot(snap.orgs, snap.nodes, snap.pending, running, snap.cohorts))
    assert [p.job_id for p in result.preempted] == ["b2"]  # one more for the second job, b3 already counted
    assert {result.waiting["a1"].code, result.waiting["a2"].code} == {WaitCode.RECLAIMING}


def test_a_borrowing_gang_is_preempted_whole_for_a_job_within_its_nominal_share():
    """b's nominal is 2 of 4 nodes; it holds 2 nodes with a gang still forming (never preempted) and runs a gang of 2 workers on the 2 it borrowed
    from a.
    a's gang of 2 wants its nominal back: b's gang is the victim (the newest), and its nodes are enough."""
    a, b = org("a", 2), org("b", 2, borrow=None)
    running = [Running("b-forming", "b", G, 2, admitted_at=T0, executors=(f"{G}-0", f"{G}-1"), preemptible=False),
               Running("b-gang", "b", G, 2, admitted_at=T0 + timedelta(seconds=5), executors=(f"{G}-2", f"{G}-3"))]
    result = plan(Snapshot(orgs(a, b), nodes(4, busy=4), [job("a-gang", "a", at=10, workers=2)], running,
                           cohorts={"c": Cohort("c")}))
    assert [p.job_id for p in result.preempted] == ["b-gang"]
    assert result.waiting["a-gang"].code is WaitCode.RECLAIMING
    assert result.waiting["a-gang"].numbers == {"preempted_jobs": 1, "devices": 2}


def test_a_borrower_admitted_in_the_same_pass_gives_back_the_node_a_reclaim_needs():
    """a's nominal is 4 nodes, it holds 2 and wants a gang of 2; b (nominal 0) runs one job on a borrowed node and
    queues another. The last free node would go to b's new job (it borrows) and the gang could then never fit;
    instead b's new job is taken back (it has not started) and b's running job preempted: the gang reclaims."""
    a, b = org("a", 4), org("b", 0, borrow=None)
    running = [Running("a0", "a", G, 1, executors=(f"{G}-0",)), Running("a1", "a", G, 1, executors=(f"{G}-1",)),
               Running("b0", "b", G, 1, executors=(f"{G}-2",))]
    pending = [job("a-gang", "a", at=10, workers=2), job("b1", "b", at=11)]
    result = plan(Snapshot(orgs(a, b), nodes(4, busy=3), pending, running, cohorts={"c": Cohort("c")}))
    assert result.admitted == [] and [p.job_id for p in result.preempted] == ["b0"]
    assert result.waiting["a-gang"].code is WaitCode.RECLAIMING
    assert result.waiting["a-gang"].numbers == {"preempted_jobs": 1, "devices": 2}
    assert result.waiting["b1"].code is WaitCode.QUOTA and "reclaimed by organisation a" in result.waiting["b1"].reason
    assert quotas.held(result.usage, "b", G) == 1  # b1's admission is not counted


def test_small_budgets_read_in_gpu_seconds():
    assert budgets.gpu_hours(3.2 * 3600) == "3.2 GPU-h" and budgets.gpu_hours(40) == "40 GPU-s"


def test_cohort_members_at_once_are_each_cohorts_members_and_checks_agree_with_them():
    from hypothesis import given, settings as hsettings, strategies as st

    @hsettings(max_examples=150, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from([None, "c1", "c2"]), st.integers(0, 4), st.integers(0, 3),
                              st.integers(0, 6), st.booleans()), min_size=1, max_size=6), st.integers(1, 5))
    def agree(rows, demand):
        orgs, usage = {}, {}
        for i, (cohort, nominal, lend, held, metered) in enumerate(rows):
            o = org(f"o{i}", nominal=nominal, borrow=3, lend=min(lend, nominal), cohort=cohort)
            orgs[o.name] = o if metered else Organisation(o.name, cohort=cohort)
            usage[o.name] = {G: held}
        by_cohort = quotas.cohort_members(orgs)
        for cohort in ("c1", "c2"):
            assert by_cohort.get(cohort, []) == quotas.members(orgs, cohort)
        for o in orgs.values():
            assert quotas.check(o, G, demand, usage, orgs, by_cohort) == quotas.check(o, G, demand, usage, orgs)

    agree()


def test_cohorts_kept_parts_follow_usage_as_it_changes_during_a_pass():
    """``Cohorts`` keeps each (cohort, group)'s pool and members' guaranteed parts once worked out; the usage it is
    asked about changes between checks (admissions, reclaims) and every answer must still be the plain one."""
    from hypothesis import given, settings as hsettings, strategies as st

    @hsettings(max_examples=150, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from([None, "c1", "c2"]), st.integers(0, 4), st.integers(0, 3),
                              st.booleans()), min_size=1, max_size=6),
           st.lists(st.tuples(st.integers(0, 5), st.sampled_from([G, "other"]), st.integers(-2, 4)), max_size=12),
           st.integers(1, 5))
    def agree(rows, changes, demand):
        orgs = {}
        for i, (cohort, nominal, lend, metered) in enumerate(rows):
            o = org(f"o{i}", nominal=nominal, borrow=3, lend=min(lend, nominal), cohort=cohort)
            orgs[o.name] = o if metered else Organisation(o.name, cohort=cohort)
        by_cohort = quotas.cohort_members(orgs)
        usage: dict[str, dict[str, int]] = {}
        for who, group, amount in changes:
            quotas.add(usage, f"o{who % len(rows)}", group, amount)
            for cohort in ("c1", "c2"):
                for g in (G, "other"):
                    assert quotas.pool(orgs, cohort, g, by_cohort) == quotas.pool(orgs, cohort, g)
                    assert quotas.pool_used(orgs, cohort, g, usage, by_cohort) == quotas.pool_used(orgs, cohort, g,
                                                                                                usage)
            for o in orgs.values():
                assert quotas.check(o, G, demand, usage, orgs, by_cohort) == quotas.check(o, G, demand, usage, orgs)

    agree()


def test_held_counts_each_cohorts_pool_use_as_it_changes_and_its_copies_apart():
    """``quota.Held``: after every ``add`` (admissions, reclaims' releases, negative amounts) each cohort's pool use
    per group is what summing the members gives, for members, unmetered and cohortless organisations and unknown
    ones; a copy counts on its own (a reclaim's trial usage) and leaves the original as it was."""
    from hypothesis import given, settings as hsettings, strategies as st

    @hsettings(max_examples=200, deadline=None)
    @given(st.lists(st.tuples(st.sampled_from([None, "c1", "c2"]), st.integers(0, 4), st.integers(0, 3),
                              st.booleans()), min_size=1, max_size=6),
           st.lists(st.tuples(st.integers(0, 7), st.sampled_from([G, "other"]), st.integers(-3, 4),
                              st.booleans(), st.booleans()), max_size=16))
    def agree(rows, changes):
        orgs = {}
        for i, (cohort, nominal, lend, metered) in enumerate(rows):
            o = org(f"o{i}", nominal=nominal, borrow=3, lend=min(lend, nominal), cohort=cohort)
            orgs[o.name] = o if metered else Organisation(o.name, cohort=cohort)
        by_cohort = quotas.cohort_members(orgs)
        held, plain = quotas.Held(by_cohort), {}
        copies: list[tuple[quotas.Held, dict]] = []
        for who, group, amount, ask, fork in changes:
            name = f"o{who}"  # o6, o7: not organisations of the snapshot
            quotas.add(held, name, group, amount)
            quotas.add(plain, name, group, amount)
            if ask:  # counts begin when first asked, and only then are moved by each add
                for cohort in ("c1", "c2"):
                    quotas.pool_used(orgs, cohort, group, held, by_cohort)
            if fork:
                copies.append((quotas.copy(held), quotas.copy(plain)))
                quotas.add(copies[-1][0], name, group, 1)
                quotas.add(copies[-1][1], name, group, 1)
            for h, p in ((held, plain), *copies):
                assert isinstance(h, quotas.Held) and h == p
                for cohort in ("c1", "c2", "none"):
                    for g in (G, "other"):
                        assert quotas.pool_used(orgs, cohort, g, h, by_cohort) == quotas.pool_used(orgs, cohort, g, p)
                for o in orgs.values():
                    assert quotas.check(o, G, 2, h, orgs, by_cohort) == quotas.check(o, G, 2, p, orgs)

    agree()
