"""Usage is scoped like jobs (issue 26, item 6): a principal without ``read:all`` sees its own jobs' GPU-seconds
and counts only, whatever it groups by; the report's total is then its own sum, and no other tenant's charge shows,
not even folded into ``unattributed``. Pure: scoping.usage_owner and domain/usage.report."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from services.gateway.auth import Principal, Role
from services.gateway.domain import usage as usages
from services.gateway.scoping import usage_owner

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, tzinfo=UTC)
START, END = T0, T0 + timedelta(days=31)
JOBS = [usages.JobFacts("a1", "north", "p", "alice", outcome="succeeded"),
        usages.JobFacts("a2", "north", "q", "alice"),
        usages.JobFacts("b1", "north", "p", "bob", outcome="failed"),
        usages.JobFacts("c1", "south", "p", "carol")]
CHARGES = [usages.Charge("a1", 10.0, T0), usages.Charge("a2", 5.0, T0), usages.Charge("b1", 700.0, T0),
           usages.Charge("c1", 9000.0, T0), usages.Charge("ghost", 3.0, T0)]


@pytest.mark.parametrize(("role", "owner"), [(Role.VIEWER, "alice"), (Role.SUBMITTER, "alice"),
                                             (Role.OPERATOR, None), (Role.AUDITOR, None), (Role.ADMIN, None)], ids=str)
def test_only_read_all_sees_every_owners_usage(role, owner):
    assert usage_owner(Principal("t", "alice", role)) == owner


@pytest.mark.parametrize("group_by", list(usages.GroupBy), ids=str)
def test_an_owners_report_holds_its_own_jobs_only(group_by):
    mine = usages.report(CHARGES, JOBS, group_by, START, END, owner="alice")
    assert mine.total_gpu_seconds == 15.0
    assert math.fsum(r.gpu_seconds for r in mine.rows) == 15.0
    assert sum(r.job_count for r in mine.rows) == 2
    assert mine.unattributed_gpu_seconds == 0.0  # bob's, carol's and the unknown job's charges stay unseen
    if group_by is usages.GroupBy.USER:
        assert [r.key for r in mine.rows] == ["alice"]


def test_owner_and_org_together_keep_what_both_allow():
    assert usages.report(CHARGES, JOBS, usages.GroupBy.USER, START, END, org="south", owner="alice").rows == []
    both = usages.report(CHARGES, JOBS, usages.GroupBy.USER, START, END, org="north", owner="bob")
    assert [(r.key, r.gpu_seconds, r.jobs["failed"]) for r in both.rows] == [("bob", 700.0, 1)]


def test_an_organisations_report_folds_no_other_organisations_charge_into_unattributed():
    north = usages.report(CHARGES, JOBS, usages.GroupBy.USER, START, END, org="north")
    assert north.total_gpu_seconds == 715.0 and north.unattributed_gpu_seconds == 0.0


def test_the_unscoped_report_is_the_whole_ledger():
    every = usages.report(CHARGES, JOBS, usages.GroupBy.USER, START, END)
    assert every.total_gpu_seconds == 9718.0 and every.unattributed_gpu_seconds == 3.0
    assert [r.key for r in every.rows] == ["carol", "bob", "alice"]
