"""Preemption of borrowed capacity in the job lifecycle: checkpoint first, requeue with no attempt spent, the
events say why and for whom."""

from __future__ import annotations

from dataclasses import replace

import pytest

from libs.contracts.jobs import JobEventKind, JobState
from libs.contracts.leases import LeaseEventKind
from libs.contracts.telemetry import RunOutcome
from services.queue.domain.lifecycle import Finished, LeaseExpired, LeaseFact, Preempt, StopOn, decide
from services.queue.domain.preemption import PREEMPTED
from tests.support import builders
from tests.support.builders import EPOCH, EX, gang_job
from tests.unit.test_gang_lifecycle import W, fin, running
from tests.unit.test_lifecycle import LATER

pytestmark = pytest.mark.unit

FACT = Preempt("hospital-a", "a-job", "organisation b borrowed 1 device; hospital-a reclaims its share")


def test_a_running_job_is_asked_to_checkpoint_and_stop_saying_for_whom():
    job = builders.job(JobState.RUNNING, org="b", devices=1, node_group="default")
    t = decide(job, FACT, LATER)
    assert t.job.state is JobState.RUNNING and t.job.stop_requested == PREEMPTED
    assert t.effects == (StopOn((EX,), EPOCH, PREEMPTED, checkpoint_first=True),)
    (event,) = t.events
    assert event.event is JobEventKind.STOP_REQUESTED and event.reason == FACT.reason
    assert event.detail["for_org"] == "hospital-a" and event.detail["for_job"] == "a-job"


@pytest.mark.parametrize("outcome", [RunOutcome.STOPPED, RunOutcome.FAILED, RunOutcome.ABANDONED], ids=str)
def test_the_end_of_a_preempted_run_requeues_it_spending_no_attempt(outcome):
    job = builders.job(JobState.RUNNING, stop_requested=PREEMPTED, last_checkpoint={"step": 40, "path": "/c/40"})
    t = decide(job, Finished(EPOCH, outcome, last_step=47), LATER)
    assert t.job.state is JobState.QUEUED and t.job.executor_id is None
    assert t.job.attempts[PREEMPTED] == 1 and t.job.attempts["training_error"] == 0
    assert t.job.last_checkpoint == {"step": 40, "path": "/c/40"}  # it resumes from there
    (event,) = t.events
    assert event.event is JobEventKind.REQUEUED and event.reason == PREEMPTED
    assert event.detail["resume_from"] == 40


def test_a_preempted_run_that_succeeded_first_is_a_success():
    job = builders.job(JobState.RUNNING, stop_requested=PREEMPTED)
    assert decide(job, Finished(EPOCH, RunOutcome.SUCCEEDED, exit_code=0), LATER).job.state is JobState.SUCCEEDED


def test_a_lost_lease_while_preempting_is_still_free():
    job = builders.job(JobState.RUNNING, stop_requested=PREEMPTED)
    t = decide(job, LeaseExpired(EPOCH), LATER)
    assert t.job.state is JobState.QUEUED and t.job.attempts["training_error"] == 0


@pytest.mark.parametrize("state", [JobState.QUEUED, JobState.SUCCEEDED, JobState.INTERRUPTED, JobState.CANCELLED],
                         ids=str)
def test_only_a_running_job_is_preempted(state):
    job = builders.job(state)
    assert decide(job, FACT, LATER).job == job


def test_a_job_already_stopping_is_not_asked_again():
    job = replace(builders.job(JobState.RUNNING), stop_requested="gpu_ceiling")
    t = decide(job, FACT, LATER)
    assert t.job == job and t.effects == ()


def test_a_running_gang_is_asked_to_checkpoint_and_stop_on_every_worker():
    t = decide(running(org="b"), FACT, LATER)
    assert t.job.stop_requested == PREEMPTED and t.effects == (StopOn(W, EPOCH, PREEMPTED, checkpoint_first=True),)


def test_a_forming_gang_is_not_preempted():
    job = gang_job(JobState.ADMITTING, ready=1)
    assert decide(job, FACT, LATER).job == job


@pytest.mark.parametrize("outcomes", [
    (RunOutcome.STOPPED, RunOutcome.STOPPED, RunOutcome.STOPPED),
    (RunOutcome.STOPPED, RunOutcome.FAILED, RunOutcome.ABANDONED),
    (RunOutcome.SUCCEEDED, RunOutcome.STOPPED, RunOutcome.STOPPED)], ids=str)
def test_a_preempted_gang_is_queued_again_for_free_once_every_worker_has_ended(outcomes):
    job = decide(running(last_checkpoint={"step": 40, "path": "/c/40"}), FACT, LATER).job
    for worker, outcome in zip(W[:-1], outcomes[:-1], strict=False):
        job = decide(job, fin(worker, outcome, 1 if outcome is RunOutcome.FAILED else None), LATER).job
        assert job.state is JobState.RUNNING and job.stop_requested == PREEMPTED  # waits for rank 0's checkpoint
    t = decide(job, fin(W[-1], outcomes[-1]), LATER)
    assert t.job.state is JobState.QUEUED and t.job.workers == () and t.job.gang == ()
    assert t.job.attempts[PREEMPTED] == 1 and t.job.attempts.get("training_error", 0) == 0
    assert t.job.last_checkpoint == {"step": 40, "path": "/c/40"}
    (event,) = t.events
    assert event.event is JobEventKind.REQUEUED and event.reason == PREEMPTED and event.epoch == EPOCH
    assert t.effects == (LeaseFact(LeaseEventKind.RELEASED, EPOCH, W[0], reason=PREEMPTED),)


def test_a_preempted_gang_that_succeeded_on_every_worker_first_is_a_success():
    job = decide(running(), FACT, LATER).job
    for worker in W:
        job = decide(job, fin(worker, RunOutcome.SUCCEEDED, 0), LATER).job
    assert job.state is JobState.SUCCEEDED
