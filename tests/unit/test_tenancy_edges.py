"""Tenancy at the edges, without servers: which organisation a token acts in, the usage report's job facts and
periods, the CLI's quota syntax, and the org spec the CLI sends."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

import pytest

from services.gateway.auth import AuthError, Principal, Role, issue_token, token_org, TokenStore
from services.gateway.domain import usage as usages
from services.gateway.orgs import acting_org, usage_org
from teto.cli_common import CliError
from teto.cli_orgs import org_spec, parse_quota

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def who(org: str | None, role: Role = Role.SUBMITTER) -> Principal:
    return Principal("t", "ann", role, org)


@pytest.mark.parametrize(("role", "org"), [(Role.VIEWER, "default"), (Role.SUBMITTER, "default"),
                                           (Role.OPERATOR, None), (Role.AUDITOR, None), (Role.ADMIN, None)], ids=str)
def test_a_token_without_an_organisation_reads_as_before_tenancy(role, org):
    assert token_org(role, None) == org
    assert token_org(role, "north") == "north"


def test_the_token_file_carries_the_organisation(tmp_path):
    path = tmp_path / "tokens.json"
    _, secret = issue_token(path, "ann", "submitter", org="north")
    _, old = issue_token(path, "bob", "submitter")
    store = TokenStore(path)
    assert store.authenticate(secret).org == "north" and store.authenticate(old).org == "default"


def test_a_bound_token_acts_in_its_organisation_only():
    assert acting_org(who("north"), None) == "north" and acting_org(who("north"), "north") == "north"
    with pytest.raises(AuthError) as refused:
        acting_org(who("north"), "south")
    assert refused.value.status == 403 and "north" in refused.value.reason


def test_a_fleet_wide_token_names_the_organisation_or_uses_the_default():
    admin = who(None, Role.ADMIN)
    assert acting_org(admin, "south") == "south" and acting_org(admin, None) == "default"
    assert usage_org(admin, None) is None and usage_org(who("north"), None) == "north"


def test_job_facts_queue_wait_outcome_interruptions_and_cadence():
    events = [{"event": "submitted", "time": T0}, {"event": "leased", "time": T0 + timedelta(seconds=30)},
              {"event": "checkpointed", "time": T0 + timedelta(seconds=60)},
              {"event": "requeued", "time": T0 + timedelta(seconds=90)},
              {"event": "leased", "time": T0 + timedelta(seconds=100)},
              {"event": "checkpointed", "time": T0 + timedelta(seconds=200)}]
    job = {"id": "j", "org": "north", "project": "rad", "owner": "ann", "state": "succeeded",
           "attempts": {"preempted": 1, "transport_lost": 1, "training_error": 2}, "last_step": 300,
           "spec": {"checkpoint_every_steps": 100}}
    facts = usages.job_facts(job, events)
    assert facts.queue_wait_seconds == 40 and facts.outcome == "succeeded" and facts.interruptions == 2
    assert (facts.checkpoints_made, facts.checkpoints_due) == (2, 3)
    assert usages.job_facts({**job, "state": "running"}, []).outcome == "active"


def test_usage_rows_group_by_project_and_user_with_csv():
    jobs = [usages.JobFacts("a", "north", "rad", "ann", "succeeded", queue_wait_seconds=10),
            usages.JobFacts("b", "north", "gen", "bob", "failed", queue_wait_seconds=30)]
    charges = [usages.Charge("a", 3600.0, T0), usages.Charge("b", 1800.0, T0),
               usages.Charge("a", 5.0, T0 - timedelta(days=40))]
    start, end = usages.period_window("2026-12", T0)
    by_project = usages.report(charges, jobs, usages.GroupBy.PROJECT, start, end)
    assert [(r.key, r.gpu_seconds) for r in by_project.rows] == [("north/rad", 3600.0), ("north/gen", 1800.0)]
    assert by_project.total_gpu_seconds == 5400.0
    assert by_project.rows[0].jobs["succeeded"] == 1 and by_project.rows[0].mean_queue_wait_seconds == 10
    csv = usages.to_csv_rows(usages.report(charges, jobs, usages.GroupBy.USER, start, end))
    assert csv[0][:3] == ["user", "gpu_seconds", "gpu_hours"] and csv[1][:3] == ["ann", "3600.000", "1.0000"]


def test_periods():
    assert usages.period_window("2026-02", T0) == (datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC))
    assert usages.period_window("2026-12-31", T0)[1] == datetime(2027, 1, 1, tzinfo=UTC)
    assert usages.period_window(None, T0) == (datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
    with pytest.raises(ValueError):
        usages.period_window("2026", T0)


@pytest.mark.parametrize(("text", "quota"), [
    ("a100=4", ("a100", {"nominal": 4, "borrowing_limit": None, "lending_limit": None})),
    ("a100=4:2", ("a100", {"nominal": 4, "borrowing_limit": 2, "lending_limit": None})),
    ("cpu=8:-:2", ("cpu", {"nominal": 8, "borrowing_limit": None, "lending_limit": 2})),
])
def test_quota_syntax(text, quota):
    assert parse_quota(text) == quota


@pytest.mark.parametrize("text", ["a100", "=4", "a100=x", "a100=:2", "a100=1:2:3:4"])
def test_bad_quotas_are_refused_with_the_syntax(text):
    with pytest.raises(CliError, match="GROUP=NOMINAL|whole numbers|nominal share"):
        parse_quota(text)


def test_the_org_spec_the_cli_sends():
    args = argparse.Namespace(cohort="h", weight=2.0, quota=["a100=4:2"], unmetered=False, budget_gpu_hours=10.0,
                              period="month", description="")
    spec = org_spec(args)
    assert spec["quotas"] == {"a100": {"nominal": 4, "borrowing_limit": 2, "lending_limit": None}}
    assert spec["budget_gpu_seconds"] == 36000.0
    assert org_spec(argparse.Namespace(**{**vars(args), "unmetered": True}))["quotas"] is None
    assert spec["run_limits"] is None
    limited = org_spec(argparse.Namespace(**{**vars(args), "run_memory_mb": 8192, "run_pids": 512}))
    assert limited["run_limits"] == {"memory_mb": 8192, "pids": 512, "disk_mb": None}


def test_the_job_view_shows_the_organisation_and_why_a_queued_job_waits():
    from services.gateway.domain.views import job_view

    waiting = {"code": "budget", "reason": "organisation budget: 40 GPU-s left, job needs 60 GPU-s", "numbers": {}}
    view = job_view({"id": "j", "state": "queued", "spec": {}, "attempts": {}, "org": "lab", "project": "default",
                     "priority": 2, "waiting": waiting})
    assert view["waiting"] == waiting and view["org"] == "lab" and view["priority"] == 2
