"""The pure rules of deciding a batch of submits (services/queue/domain/submits.py): which command ids are
decided and which are repeats, and why a submit is refused (gang policy first, then organisation, then
project), each submit on its own."""

from __future__ import annotations

import pytest

from libs.contracts.jobs import RunLimits
from libs.contracts.policies import GangPolicy
from services.queue.domain.lifecycle import Refusal
from services.queue.domain.submits import (Target, first_of_each, limits_refusal, needs_policy, submit_refusal,
                                           target_refusal, with_org_limits)
from tests.support import builders

pytestmark = pytest.mark.unit

EXISTING = {("default", "default"): Target(True, True), ("acme", "x"): Target(True, False),
            ("ghost", "default"): Target(False, False)}


@pytest.mark.parametrize(("ids", "firsts"), [
    ([], []), (["a"], [0]), (["a", "b", "c"], [0, 1, 2]), (["a", "a"], [0]), (["a", "b", "a", "b", "c"], [0, 1, 4]),
], ids=["empty", "one", "distinct", "twice", "interleaved repeats"])
def test_each_command_id_is_decided_at_its_first_occurrence(ids, firsts):
    assert first_of_each(ids) == firsts


def test_the_gang_policy_is_read_only_when_a_spec_asks_for_its_own_ready_timeout():
    assert not needs_policy([builders.spec(), builders.spec()])
    assert needs_policy([builders.spec(), builders.spec(ready_timeout_seconds=5)])
    assert not needs_policy([])


@pytest.mark.parametrize(("target", "reason"), [
    (Target(True, True), None),
    (Target(True, False), "project p does not exist in organisation o"),
    (Target(False, False), "organisation o does not exist"),
    (Target(False, True), "organisation o does not exist"),
], ids=["both exist", "no project", "no organisation", "organisation checked first"])
def test_a_job_goes_only_to_an_existing_organisation_and_project(target, reason):
    refusal = target_refusal("o", "p", target)
    assert (refusal.reason if refusal else None) == reason


def test_a_ready_timeout_longer_than_the_policy_is_refused_with_both_numbers_before_tenancy_is_looked_at():
    refusal = submit_refusal(builders.spec(ready_timeout_seconds=300, project="x"), "acme",
                             GangPolicy(ready_timeout_seconds=60), EXISTING)
    assert isinstance(refusal, Refusal) and "longer than the gang policy's 60" in refusal.reason
    assert refusal.detail == {"ready_timeout_seconds": 300, "policy_ready_timeout_seconds": 60}


def test_a_shorter_ready_timeout_passes_the_policy_and_is_then_checked_for_its_project():
    assert submit_refusal(builders.spec(ready_timeout_seconds=30), "default", GangPolicy(ready_timeout_seconds=60),
                          EXISTING) is None
    refusal = submit_refusal(builders.spec(ready_timeout_seconds=30, project="x"), "acme", GangPolicy(), EXISTING)
    assert refusal == Refusal("project x does not exist in organisation acme", {})


def test_each_submit_is_judged_on_its_own_target():
    verdicts = [submit_refusal(builders.spec(project=p), org, None, EXISTING)
                for org, p in [("default", "default"), ("ghost", "default"), ("default", "default")]]
    assert [v.reason if v else None for v in verdicts] == [None, "organisation ghost does not exist", None]


def test_a_spec_with_a_ready_timeout_cannot_be_judged_without_the_policy():
    with pytest.raises(ValueError):
        submit_refusal(builders.spec(ready_timeout_seconds=5), "default", None, EXISTING)


# -- the organisation's run limits (issue 26, item 6) -------------------------------------------------------

ORG_LIMITS = Target(True, True, RunLimits(memory_mb=4096, pids=256, disk_mb=None))


@pytest.mark.parametrize(("asked", "refused"), [
    ({}, None), ({"memory_mb": 4096}, None), ({"memory_mb": 4097}, "limits.memory_mb 4097"),
    ({"pids": 257}, "limits.pids 257"), ({"disk_mb": 10**6}, None), ({"memory_mb": 64, "pids": 8}, None)],
    ids=["none", "at-the-limit", "memory-above", "pids-above", "disk-unlimited-by-org", "below"])
def test_a_job_asks_for_no_more_than_its_organisation_allows_per_run(asked, refused):
    found = limits_refusal(builders.spec(limits=asked), "acme", ORG_LIMITS)
    assert (found is None) if refused is None else (found.reason.startswith(refused) and "allows per run" in
                                                    found.reason and found.detail["allowed"] in (4096, 256))
    if refused is not None:
        targets = {("acme", "default"): ORG_LIMITS}
        assert submit_refusal(builders.spec(limits=asked), "acme", None, targets).reason == found.reason


def test_a_job_gets_its_organisations_limit_for_each_it_leaves_unset():
    spec = with_org_limits(builders.spec(limits={"memory_mb": 512}), ORG_LIMITS)
    assert spec.limits == RunLimits(memory_mb=512, pids=256, disk_mb=None)
    no_limits = builders.spec(limits={})
    assert with_org_limits(no_limits, Target(True, True)) == no_limits  # an organisation without limits
    assert with_org_limits(builders.spec(limits={"pids": 8}), None) == builders.spec(limits={"pids": 8})
