"""Tenancy's invariants under random fleets, quotas and queues (hypothesis):
no organisation exceeds nominal + borrowing limit; an organisation under its nominal share is never starved;
reservations never exceed the budget; the usage report's sums equal the ledger's."""

from __future__ import annotations

import dataclasses
import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.queue.tenancy import budget as budgets
from services.queue.tenancy import quota as quotas
from services.gateway.domain import usage as usages
from services.queue.tenancy.placement import plan
from services.queue.tenancy.placement_types import Node, Snapshot, WaitCode
from services.queue.tenancy.model import Cohort, GroupQuota, Organisation, Pending, Preemption, Running

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, tzinfo=UTC)
GROUPS = ("a", "b")
GPUS = {"a": 1, "b": 2}  # homogeneous groups: every node of "b" has 2 GPUs
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def fleets(draw, preemption: Preemption = Preemption.RECLAIM_BORROWED, physically_backed: bool = False):
    """Organisations in one cohort, nodes per group, and a queue of jobs sized to whole nodes."""
    n_nodes = {g: draw(st.integers(1, 6)) for g in GROUPS}
    n_orgs = draw(st.integers(1, 4))
    orgs = {}
    left = dict(n_nodes)
    for i in range(n_orgs):
        group_quotas = {}
        for g in GROUPS:
            cap = left[g] if physically_backed else n_nodes[g] + 2
            nominal_nodes = draw(st.integers(0, max(0, cap)))
            left[g] -= nominal_nodes if physically_backed else 0
            group_quotas[g] = GroupQuota(nominal_nodes * GPUS[g],
                                         draw(st.none() | st.integers(0, 4)),
                                         draw(st.none() | st.integers(0, 4)))
        orgs[f"o{i}"] = Organisation(f"o{i}", cohort="c", weight=draw(st.sampled_from([1.0, 2.0])),
                                     quotas=group_quotas)
    nodes = [Node(f"{g}{k}", g, GPUS[g]) for g in GROUPS for k in range(n_nodes[g])]
    pending = []
    for j in range(draw(st.integers(0, 14))):
        g = draw(st.sampled_from(GROUPS))
        pending.append(Pending(f"j{j}", draw(st.sampled_from(sorted(orgs))), T0 + timedelta(seconds=j),
                               workers=draw(st.integers(1, 2)), gpus_per_worker=GPUS[g],
                               priority=draw(st.integers(0, 2))))
    return Snapshot(orgs, nodes, pending, cohorts={"c": Cohort("c", preemption)})


def run(snap: Snapshot, more: list[Pending]) -> Snapshot:
    """The fleet after a first pass: its admissions run, nodes taken, a second wave queued."""
    first = plan(snap)
    taken = {e for a in first.admitted for e in a.workers}
    jobs = {p.job_id: p for p in snap.pending}
    running = [Running(a.job_id, a.org, a.group, a.devices, jobs[a.job_id].priority, T0 + timedelta(seconds=a.rank),
                       a.workers) for a in first.admitted]
    nodes = [Node(n.executor_id, n.group, n.gpus, free=n.executor_id not in taken) for n in snap.nodes]
    return Snapshot(snap.orgs, nodes, more, running, snap.cohorts)


def within_limits(usage, orgs) -> None:
    for org in orgs.values():
        for g in GROUPS:
            ceiling = org.ceiling(g)
            assert ceiling is None or quotas.held(usage, org.name, g) <= ceiling, (org, g, usage)
        for g in GROUPS:
            assert quotas.pool_used(orgs, "c", g, usage) <= quotas.pool(orgs, "c", g) or all(
                quotas.held(usage, o, g) <= orgs[o].quota(g).guaranteed for o in orgs)


@FAST
@given(fleets(), st.data())
def test_no_organisation_exceeds_nominal_plus_borrowing_limit(snap, data):
    first = plan(snap)
    within_limits(first.usage, snap.orgs)
    second = plan(run(snap, data.draw(fleets()).pending))
    within_limits(second.usage, snap.orgs)


@FAST
@given(fleets(physically_backed=True), fleets(physically_backed=True))
def test_an_organisation_under_its_nominal_share_is_never_starved(snap, wave):
    """Quotas backed by nodes (nominals sum to at most each group's nodes): after a pass, no job waits for
    capacity while its organisation, counting what is being reclaimed for it, is under its nominal share."""
    pending = [Pending(p.job_id + "w", p.org, p.created_at + timedelta(hours=1), p.workers, p.gpus_per_worker,
                       p.priority) for p in wave.pending if p.org in snap.orgs]
    later = run(snap, pending)
    result = plan(later)
    jobs = {p.job_id: p for p in later.pending}
    reclaimed: dict[tuple[str, str | None], int] = {}
    for wait in result.waiting.values():
        if wait.code is WaitCode.RECLAIMING:
            key = (jobs[wait.job_id].org, wait.group)
            reclaimed[key] = reclaimed.get(key, 0) + int(wait.numbers["devices"])
    for wait in result.waiting.values():
        if wait.code not in (WaitCode.BEHIND, WaitCode.QUOTA):
            continue
        job = jobs[wait.job_id]
        org = later.orgs[job.org]
        for group in GROUPS:
            nodes = sorted(n.gpus for n in later.nodes if n.group == group and n.gpus >= job.gpus_per_worker)
            if len(nodes) < job.workers:
                continue
            need = sum(nodes[:job.workers])
            holds = quotas.held(result.usage, org.name, group) + reclaimed.get((org.name, group), 0)
            assert holds + need > org.quota(group).nominal, (wait, group, result.usage, reclaimed)


def _mixed(snap: Snapshot, where: list[str | None]) -> Snapshot:
    """The fleet with its organisations spread over two cohorts and none (unmetered ones stay unmetered)."""
    orgs = {n: dataclasses.replace(o, cohort=where[i % len(where)]) for i, (n, o) in enumerate(snap.orgs.items())}
    return Snapshot(orgs, snap.nodes, snap.pending, snap.running,
                    {**snap.cohorts, "d": Cohort("d", Preemption.RECLAIM_BORROWED)})


@FAST
@given(fleets(), st.data(), st.lists(st.sampled_from(["c", "d", None]), min_size=1, max_size=4))
def test_pool_use_counted_as_usage_changes_plans_exactly_what_recounting_plans(snap, data, where):
    """``quota.Held`` moves each cohort's pool use with every admission and reclaim instead of summing the members
    on each quota check: on random fleets, cohorts and a second wave with running jobs (reclaims), the plan is
    the very plan recounting gives (admissions in order, waits with their reasons, preemptions, fairness order,
    usage)."""
    snap = _mixed(snap, where)
    for fleet in (snap, run(snap, data.draw(fleets()).pending)):
        counted = plan(fleet)
        with pytest.MonkeyPatch.context() as mp:  # every check sums the members again, as before ``Held``
            mp.setattr(quotas.Held, "pool_used", lambda self, c, g: self.cohorts.count_pool_used(c, g, self))
            recounted = plan(fleet)
        assert counted == recounted


@FAST
@given(st.floats(0, 1e6), st.lists(st.tuples(st.floats(0, 2e5), st.floats(0, 1)), max_size=30))
def test_reservations_never_exceed_the_budget(budget, jobs):
    account = budgets.BudgetAccount("o", budget)
    running: list[tuple[str, float, float]] = []
    for i, (needs, used_fraction) in enumerate(jobs):
        result = budgets.reserve(account, f"j{i}", needs)
        if isinstance(result, budgets.BudgetAccount):
            account = result
            running.append((f"j{i}", needs, used_fraction))
        else:
            assert needs > budget - account.consumed - account.reserved
        assert account.consumed + account.reserved <= budget * (1 + 1e-9) + 1e-6
        if i % 3 == 2 and running:  # a run ends, using at most its reservation (it stops at its ceiling)
            job_id, needs_, fraction = running.pop(0)
            account = budgets.settle(account, job_id, needs_ * fraction)
            assert account.consumed + account.reserved <= budget * (1 + 1e-9) + 1e-6


@FAST
@given(st.lists(st.tuples(st.integers(0, 9), st.floats(0, 1e5), st.integers(0, 40)), max_size=60),
       st.sampled_from(list(usages.GroupBy)))
def test_the_usage_report_sums_to_the_ledger(ledger, group_by):
    jobs = [usages.JobFacts(f"j{i}", f"o{i % 3}", f"p{i % 2}", f"u{i % 4}") for i in range(8)]
    charges = [usages.Charge(f"j{j}", s, T0 + timedelta(days=d)) for j, s, d in ledger]  # j8, j9: unknown jobs
    start, end = T0, T0 + timedelta(days=31)
    result = usages.report(charges, jobs, group_by, start, end)
    in_period = [c.gpu_seconds for c in charges if start <= c.at < end]
    assert result.total_gpu_seconds == math.fsum(in_period)
    rows = math.fsum([*(r.gpu_seconds for r in result.rows), result.unattributed_gpu_seconds])
    assert rows == pytest.approx(result.total_gpu_seconds, abs=1e-6)
    assert round(rows) == round(result.total_gpu_seconds) or abs(rows - result.total_gpu_seconds) < 1e-6
    for org in ("o0", "o1"):
        one = usages.report(charges, jobs, group_by, start, end, org=org)
        assert math.fsum(r.gpu_seconds for r in one.rows) == pytest.approx(one.total_gpu_seconds, abs=1e-6)
