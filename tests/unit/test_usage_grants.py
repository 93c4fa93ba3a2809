"""The budget believes a usage record only as far as a lease grant allows (services/budget/domain/grants.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.budget.domain.grants import (UNKNOWN_DEVICES, Grant, JobLease, Verdict, grant_of, judge, judge_batch,
                                           to_judge_again)
from services.budget.domain.usage import Charge

T0 = datetime(2026, 12, 1, 4, 0, tzinfo=UTC)
NOW = T0 + timedelta(seconds=100)
GRANT = Grant("j", 2, ("ex-a", "ex-b"), 4, T0)
JOB = JobLease(epoch=2)


def charge(executor: str = "ex-a", *, epoch: int = 2, seq: int = 1, devices: int = 4, wall: float = 10.0,
           job: str = "j") -> Charge:
    return Charge(job, executor, epoch, seq, devices, wall)


def test_the_holder_within_the_grant_is_charged():
    assert judge(charge(), GRANT, JOB, used_before=0.0, now=NOW).verdict is Verdict.CHARGE


def test_the_issue_s_forged_record_from_an_executor_never_granted_is_refused():
    forged = charge("ex-z", devices=4096, wall=2_592_000.0)
    j = judge(forged, GRANT, JOB, used_before=0.0, now=NOW)
    assert j.verdict is Verdict.REFUSE and "does not hold" in j.reason


@pytest.mark.parametrize(("devices", "verdict"), [(1, Verdict.CHARGE), (4, Verdict.CHARGE), (5, Verdict.REFUSE),
                                                  (4096, Verdict.REFUSE)], ids=str)
def test_devices_beyond_the_grant_per_worker_are_refused(devices, verdict):
    j = judge(charge(devices=devices), GRANT, JOB, used_before=0.0, now=NOW)
    assert j.verdict is verdict
    if verdict is Verdict.REFUSE:
        assert f"{devices} devices claimed, 4 granted" in j.reason


@pytest.mark.parametrize(("used", "wall", "slack", "verdict"), [
    (0.0, 100.0, 0.0, Verdict.CHARGE),  # exactly the time since the grant
    (0.0, 100.5, 0.0, Verdict.REFUSE),
    (90.0, 10.0, 0.0, Verdict.CHARGE),
    (90.0, 10.5, 0.0, Verdict.REFUSE),  # the run's earlier records count
    (90.0, 30.0, 30.0, Verdict.CHARGE),  # within the clocks' slack
    (90.0, 41.0, 30.0, Verdict.REFUSE),
])
def test_wall_time_beyond_the_time_since_the_grant_is_refused(used, wall, slack, verdict):
    j = judge(charge(wall=wall), GRANT, JOB, used_before=used, now=NOW, slack_seconds=slack)
    assert j.verdict is verdict
    if verdict is Verdict.REFUSE:
        assert "since the grant" in j.reason


def test_a_grant_in_the_future_of_the_budget_s_clock_allows_only_the_slack():
    early = T0 - timedelta(seconds=5)
    assert judge(charge(wall=30.0), GRANT, JOB, used_before=0.0, now=early).verdict is Verdict.CHARGE
    assert judge(charge(wall=30.5), GRANT, JOB, used_before=0.0, now=early).verdict is Verdict.REFUSE


@pytest.mark.parametrize(("job", "verdict"), [
    (JobLease(epoch=0), Verdict.HOLD),  # the grant has not reached the budget yet
    (JobLease(epoch=2), Verdict.HOLD),
    # The job's epoch (or its end) came with a later event that committed before the ``leased`` one: the budget's
    # replicas share the job events' consumer. The grant is on its way; refusing lost really used time.
    (JobLease(epoch=3), Verdict.HOLD),
    (JobLease(epoch=4), Verdict.HOLD),
    (JobLease(epoch=3, ended=True), Verdict.HOLD),
    (JobLease(epoch=4, ended=True), Verdict.HOLD),
    (JobLease(epoch=2, ended=True), Verdict.REFUSE),  # the job ended before epoch 3: no grant will come
    (JobLease(epoch=0, ended=True), Verdict.REFUSE),
], ids=lambda v: str(v))
def test_a_record_without_a_grant_is_held_while_its_grant_can_still_come_else_refused(job, verdict):
    j = judge(charge(epoch=3), None, job, used_before=0.0, now=NOW)
    assert j.verdict is verdict
    if verdict is Verdict.REFUSE:
        assert "never granted" in j.reason and f"ended at epoch {job.epoch}" in j.reason


def test_the_holder_of_an_old_epoch_is_still_charged_its_time():
    old = Grant("j", 1, ("ex-a",), 4, T0)
    assert judge(charge(epoch=1), old, JobLease(epoch=5), used_before=0.0, now=NOW).verdict is Verdict.CHARGE
    assert judge(charge("ex-b", epoch=1), old, JobLease(epoch=5), used_before=0.0, now=NOW).verdict is Verdict.REFUSE


def test_a_grant_from_before_the_budget_kept_holders_bounds_figures_but_not_the_sender():
    legacy = Grant("j", 2, (), 4, T0)
    assert judge(charge("anyone"), legacy, JOB, used_before=0.0, now=NOW).verdict is Verdict.CHARGE
    assert judge(charge("anyone", devices=5), legacy, JOB, used_before=0.0, now=NOW).verdict is Verdict.REFUSE


def test_a_batch_adds_each_run_s_records_in_seq_order_and_refused_ones_do_not_count():
    grants = {("j", 2): GRANT}
    batch = [charge(seq=3, wall=30.0), charge(seq=1, wall=40.0), charge(seq=2, wall=50.0),
             charge("ex-b", seq=1, wall=60.0), charge("ex-z", seq=1), charge(seq=4, wall=10.0)]
    out = judge_batch(batch, grants, {"j": JOB}, {("j", "ex-a", 2): 5.0}, now=NOW, slack_seconds=0.0)
    # ex-a: 5 in the ledger, +40 (seq 1), +50 (seq 2): 95; seq 3 (+30) is refused; seq 4 (+10) is not: 105 > 100.
    assert [(c.executor_id, c.seq) for c in out.charged] == [("ex-a", 1), ("ex-a", 2), ("ex-b", 1)]
    assert sorted((j.charge.executor_id, j.charge.seq) for j in out.refused) == [("ex-a", 3), ("ex-a", 4),
                                                                                 ("ex-z", 1)]
    assert not out.held


def test_a_repeated_identity_in_a_batch_shares_its_verdict_and_is_refused_once():
    batch = [charge(), charge(), charge("ex-z"), charge("ex-z"), charge(epoch=3), charge(epoch=3)]
    out = judge_batch(batch, {("j", 2): GRANT}, {"j": JOB}, {}, now=NOW)
    assert len(out.charged) == 2 and len(out.held) == 2 and len(out.refused) == 1


def test_a_batch_of_an_unknown_job_is_held():
    out = judge_batch([charge(job="new", epoch=1)], {}, {}, {}, now=NOW)
    assert [c.job_id for c in out.held] == ["new"]


@pytest.mark.parametrize(("workers", "gang", "per_worker"), [
    (["a"], 8, 8), (["a", "b"], 8, 4), (["a", "b", "a"], 8, 4), (["a", "b", "c"], 3, 1),
    (["a"], None, UNKNOWN_DEVICES), (["a", "b"], None, UNKNOWN_DEVICES),  # the submission not seen yet
    (["a", "b"], 3, 2),
])
def test_a_leased_event_s_grant_shares_the_gang_s_devices_among_its_workers(workers, gang, per_worker):
    g = grant_of("j", 1, workers, gang, T0)
    assert g.devices == per_worker and g.workers == tuple(dict.fromkeys(workers))


@pytest.mark.parametrize(("was", "now", "again"), [
    (JobLease(0), JobLease(1), True),  # granted: the records waiting for it
    (JobLease(1), JobLease(1), False),
    (JobLease(1), JobLease(1, ended=True), True),  # ended: no grant will come
    (JobLease(1, ended=True), JobLease(1, ended=True), False),
    (JobLease(2), JobLease(3, ended=True), True),
], ids=["granted", "unchanged", "ended", "already-ended", "granted-and-ended"])
def test_held_records_are_judged_again_when_the_job_s_epoch_moves_or_it_ends(was, now, again):
    assert to_judge_again({"j": was}, {"j": now}) == (["j"] if again else [])


@pytest.mark.parametrize(("was", "now"), [(JobLease(1), JobLease(1)), (JobLease(1, ended=True),
                                                                       JobLease(1, ended=True))],
                         ids=["running", "ended"])
def test_held_records_are_judged_again_when_a_grant_of_their_job_arrives_whatever_its_epoch(was, now):
    assert to_judge_again({"j": was, "k": was}, {"j": now, "k": now}, ["j"]) == ["j"]


def test_a_record_whose_leased_event_commits_after_a_later_event_of_its_job_is_charged_when_it_comes():
    """The health round of tests/faults/test_cluster_rehearsal.py: usage sent, never in the ledger. One replica
    commits the job's ``started`` (epoch 1) while the other still holds its ``leased`` batch."""
    record = charge(epoch=1, devices=1, wall=0.05)
    grant = Grant("j", 1, ("ex-a",), 1, T0)
    # 1. The record overtakes both events: held.
    assert judge_batch([record], {}, {"j": JobLease(0)}, {}, now=NOW).held == [record]
    # 2. ``started`` commits first: the epoch moved, the record is judged again without its grant; still held.
    running = JobLease(1)
    assert to_judge_again({"j": JobLease(0)}, {"j": running}) == ["j"]
    assert judge_batch([record], {}, {"j": running}, {}, now=NOW).held == [record]
    # 3. Then the job ends, the ``leased`` event still behind: the record's epoch was the job's, still held.
    ended = JobLease(1, ended=True)
    assert judge_batch([record], {}, {"j": ended}, {}, now=NOW).held == [record]
    # 4. The ``leased`` event commits: nothing about the job moves, but its grant came; the record is charged.
    assert to_judge_again({"j": ended}, {"j": ended}, ["j"]) == ["j"]
    assert judge_batch([record], {("j", 1): grant}, {"j": ended}, {}, now=NOW).charged == [record]


@pytest.mark.parametrize(("devices", "job", "verdict"), [
    (1, JOB, Verdict.CHARGE),  # every worker holds one device at least
    (2, JOB, Verdict.HOLD),  # until the submission says how many the grant allows
    (4096, JOB, Verdict.HOLD),
    (2, JobLease(epoch=2, ended=True), Verdict.HOLD),  # the submission comes all the same
], ids=str)
def test_a_grant_taken_before_its_job_s_submission_holds_records_of_more_than_one_device(devices, job, verdict):
    """The leased event can commit before the submission (the replicas share the job events' consumer): the grant
    cannot say how many devices yet, and a record refused then was lost for good."""
    unsized = grant_of("j", 2, ["ex-a", "ex-b"], None, T0)
    assert judge(charge(devices=devices), unsized, job, used_before=0.0, now=NOW).verdict is verdict
    sized = grant_of("j", 2, ["ex-a", "ex-b"], 4, T0)  # the submission came: 2 workers x 2 GPUs
    assert judge(charge(devices=2), sized, job, used_before=0.0, now=NOW).verdict is Verdict.CHARGE
    assert judge(charge(devices=3), sized, job, used_before=0.0, now=NOW).verdict is Verdict.REFUSE
