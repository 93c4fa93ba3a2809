"""The pure rules of deciding a batch of submits (services/queue/domain/submits.py): which command ids are
decided and which are repeats, and why a submit is refused (gang policy first, then organisation, then
project), each submit on its own."""

from __future__ import annotations

import pytest

from libs.contracts.jobs import JobSpec
from libs.contracts.policies import GangPolicy
from services.queue.domain.lifecycle import Refusal
from services.queue.domain.submits import Target, first_of_each, needs_policy, submit_refusal, target_refusal

pytestmark = pytest.mark.unit

EXISTING = {("default", "default"): Target(True, True), ("acme", "x"): Target(True, False),
            ("ghost", "default"): Target(False, False)}


def spec(**kw) -> JobSpec:
    return JobSpec(workload={"kind": "finetune"}, **kw)


@pytest.mark.parametrize(("ids", "firsts"), [
    ([], []), (["a"], [0]), (["a", "b", "c"], [0, 1, 2]), (["a", "a"], [0]), (["a", "b", "a", "b", "c"], [0, 1, 4]),
], ids=["empty", "one", "distinct", "twice", "interleaved repeats"])
def test_each_command_id_is_decided_at_its_first_occurrence(ids, firsts):
    assert first_of_each(ids) == firsts


def test_the_gang_policy_is_read_only_when_a_spec_asks_for_its_own_ready_timeout():
    assert not needs_policy([spec(), spec()])
    assert needs_policy([spec(), spec(ready_timeout_seconds=5)])
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
    refusal = submit_refusal(spec(ready_timeout_seconds=300, project="x"), "acme",
                             GangPolicy(ready_timeout_seconds=60), EXISTING)
    assert isinstance(refusal, Refusal) and "longer than the gang policy's 60" in refusal.reason
    assert refusal.detail == {"ready_timeout_seconds": 300, "policy_ready_timeout_seconds": 60}


def test_a_shorter_ready_timeout_passes_the_policy_and_is_then_checked_for_its_project():
    assert submit_refusal(spec(ready_timeout_seconds=30), "default", GangPolicy(ready_timeout_seconds=60),
                          EXISTING) is None
    refusal = submit_refusal(spec(ready_timeout_seconds=30, project="x"), "acme", GangPolicy(), EXISTING)
    assert refusal == Refusal("project x does not exist in organisation acme", {})


def test_each_submit_is_judged_on_its_own_target():
    verdicts = [submit_refusal(spec(project=p), org, None, EXISTING)
                for org, p in [("default", "default"), ("ghost", "default"), ("default", "default")]]
    assert [v.reason if v else None for v in verdicts] == [None, "organisation ghost does not exist", None]


def test_a_spec_with_a_ready_timeout_cannot_be_judged_without_the_policy():
    with pytest.raises(ValueError):
        submit_refusal(spec(ready_timeout_seconds=5), "default", None, EXISTING)
