"""The lifecycle of gangs: admitting, ready, ready timeout and backoff, a node failure per strategy, and the
gang's end decided by what every worker's end says. Every (state, gang fact) pair first, then the rules."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from libs.contracts.jobs import TERMINAL_STATES, JobEventKind, JobState
from libs.contracts.leases import LeaseEventKind
from libs.contracts.telemetry import EXIT_PEER_LOST, RunOutcome
from services.queue.domain.gang_admission import Backoff
from services.queue.domain.lifecycle import (
    AdmissionDue,
    Cancel,
    Finished,
    Granted,
    Job,
    LeaseExpired,
    LeaseFact,
    NodeFailed,
    ReadyTimedOut,
    Refusal,
    Renew,
    RunOn,
    StepReported,
    StopForCeiling,
    StopOn,
    Transition,
    WorkerReady,
    decide,
)
from tests.support import builders
from tests.support.builders import EPOCH, GANG, READY_WITHIN, T0, gang_job

pytestmark = pytest.mark.unit

W = GANG
LEASE = T0 + builders.LEASE
DEADLINE = T0 + READY_WITHIN
AFTER = DEADLINE + timedelta(seconds=1)
BACKOFF = Backoff(n=1, base_delay_seconds=10.0, delay_seconds=10.5, jitter=0.5)


def running(**kw) -> Job:
    return gang_job(JobState.RUNNING, ready=len(W), **kw)


def fin(executor: str, outcome: RunOutcome, code: int | None = None, epoch: int = EPOCH) -> Finished:
    return Finished(epoch, outcome, exit_code=code, executor_id=executor, error="boom" if code else None)


FACTS = {
    "granted": lambda: Granted(W, EPOCH + 1, LEASE, rendezvous="h:1", ready_deadline=DEADLINE),
    "renew": lambda: Renew("w1", EPOCH, LEASE + timedelta(seconds=6)),
    "ready": lambda: WorkerReady(EPOCH, "w1"),
    "ready_timeout": lambda: ReadyTimedOut(EPOCH, BACKOFF),
    "ready_timeout_limit": lambda: ReadyTimedOut(EPOCH, None),
    "admission_due": lambda: AdmissionDue(),
    "finished_failed": lambda: fin("w1", RunOutcome.FAILED, 1),
    "finished_peer_lost": lambda: fin("w1", RunOutcome.FAILED, EXIT_PEER_LOST),
    "finished_abandoned": lambda: fin("w1", RunOutcome.ABANDONED),
    "finished_handed_back": lambda: fin("w1", RunOutcome.HANDED_BACK),
    "finished_succeeded": lambda: fin("w1", RunOutcome.SUCCEEDED, 0),
    "lease_expired": lambda: LeaseExpired(EPOCH),
    "node_failed": lambda: NodeFailed("w1", "ecc errors"),
    "cancel": lambda: Cancel("enough", "ann"),
    "stop_for_ceiling": lambda: StopForCeiling(ceiling_seconds=600, consumed_seconds=601),
}
REFUSED, UNCHANGED = "refused", "unchanged"


def expected(state: JobState, fact: str) -> str | JobState:
    """The gang rule book as a table (current epoch; an admitting gang has no worker ready; the scanner's
    facts come at AFTER, past the ready deadline, the back-off end and every lease)."""
    admitting, run = state is JobState.ADMITTING, state is JobState.RUNNING
    if fact == "granted":
        return JobState.ADMITTING if state is JobState.QUEUED else REFUSED
    if fact == "renew":
        return state if admitting or run else REFUSED
    if fact == "ready":
        return JobState.ADMITTING if admitting else UNCHANGED  # 1 of 3 ready
    if fact == "ready_timeout":
        return JobState.BACKOFF if admitting else UNCHANGED
    if fact == "ready_timeout_limit":
        return JobState.FAILED if admitting else UNCHANGED
    if fact == "admission_due":
        return JobState.QUEUED if state is JobState.BACKOFF else UNCHANGED
    if fact == "finished_failed":  # a training error: an attempt is spent, the job requeued
        return JobState.QUEUED if admitting or run else UNCHANGED
    if fact in ("finished_peer_lost", "finished_succeeded"):  # recorded; the others decide
        return state if admitting or run else UNCHANGED
    if fact == "finished_abandoned":  # a node failure once running; the ready timeout's while admitting
        return JobState.QUEUED if run else (state if admitting else UNCHANGED)
    if fact == "finished_handed_back":  # never started: the gang cannot form, requeued at once either way
        return JobState.QUEUED if admitting or run else UNCHANGED
    if fact in ("lease_expired", "node_failed"):
        return JobState.QUEUED if run else UNCHANGED
    if fact == "cancel":
        return REFUSED if state in TERMINAL_STATES else JobState.CANCELLED
    if fact == "stop_for_ceiling":
        if state in TERMINAL_STATES or state is JobState.INTERRUPTED:
            return UNCHANGED
        return JobState.RUNNING if run else JobState.INTERRUPTED
    raise AssertionError(fact)


PAIRS = [(s, f) for s in JobState for f in FACTS]


@pytest.mark.parametrize(("state", "fact"), PAIRS, ids=[f"{s.name} => {f}" for s, f in PAIRS])
def test_every_state_and_gang_fact(state: JobState, fact: str):
    job = gang_job(state)
    result = decide(job, FACTS[fact](), AFTER)
    want = expected(state, fact)
    if want == REFUSED:
        assert isinstance(result, Refusal) and result.reason
    elif want == UNCHANGED:
        assert isinstance(result, Transition) and not result.changed and result.job == job and result.ignored
        assert result.events == () and result.effects == ()
    else:
        assert isinstance(result, Transition) and result.changed, result
        assert result.job.state is want
        if result.events:
            assert result.events[-1].state is want
        if want not in (JobState.ADMITTING, JobState.RUNNING):  # a job that left its run holds no node
            assert result.job.workers == () and result.job.gang == () and result.job.lease_expires_at is None


GANG_RUN_FACTS = ("ready", "finished_failed", "finished_peer_lost", "finished_abandoned", "finished_handed_back",
                  "finished_succeeded", "ready_timeout")


@pytest.mark.parametrize("state", [JobState.ADMITTING, JobState.RUNNING], ids=str)
@pytest.mark.parametrize("fact", GANG_RUN_FACTS)
def test_a_gang_fact_from_an_older_epoch_changes_nothing(state, fact):
    job = gang_job(state, ready=3 if state is JobState.RUNNING else 0)
    result = decide(job, replace(FACTS[fact](), epoch=EPOCH - 1), AFTER)
    assert isinstance(result, Transition) and not result.changed and result.job == job


# -- admission --------------------------------------------------------------------------------------------

def test_a_gang_grant_reserves_every_worker_and_tells_each_where_to_meet():
    t = decide(gang_job(JobState.QUEUED), FACTS["granted"](), T0)
    assert t.job.state is JobState.ADMITTING and t.job.workers == W and t.job.rendezvous == "h:1"
    assert t.job.ready_deadline == DEADLINE and t.job.admitted_at == T0
    assert [w.executor_id for w in t.job.gang] == list(W) and all(w.ready_at is None for w in t.job.gang)
    (ev,) = t.events
    assert ev.event is JobEventKind.LEASED and ev.state is JobState.ADMITTING
    assert ev.detail["rendezvous"] == "h:1" and ev.detail["ready_deadline"] == DEADLINE.isoformat()
    assert t.effects[0] == RunOn(W, EPOCH + 1, EPOCH + 1)


def test_the_gang_runs_when_its_last_worker_is_ready():
    job = gang_job()
    for i, e in enumerate(W):
        t = decide(job, WorkerReady(EPOCH, e), T0 + timedelta(seconds=i + 1))
        job = t.job
        assert t.events[0].event is JobEventKind.WORKER_READY and t.events[0].detail["ready"] == i + 1
    assert job.state is JobState.RUNNING and job.ready_deadline is None
    assert t.events[-1].event is JobEventKind.ADMITTED and t.events[-1].detail["seconds_to_ready"] == 3.0


@pytest.mark.parametrize("fact", [WorkerReady(EPOCH, "w0"), WorkerReady(EPOCH, "stranger")], ids=["again", "stranger"])
def test_a_repeated_or_foreign_ready_changes_nothing(fact):
    job = gang_job(ready=1)
    assert not decide(job, fact, T0).changed


def test_ready_timeout_releases_everything_and_backs_off_without_spending_an_attempt():
    job = gang_job(ready=2)
    t = decide(job, ReadyTimedOut(EPOCH, BACKOFF), AFTER)
    assert t.job.state is JobState.BACKOFF and t.job.backoff_count == 1
    assert t.job.next_admission_at == AFTER + timedelta(seconds=10.5)
    assert t.job.attempts["gang_timeout"] == 1 and t.job.attempts["training_error"] == 0
    assert t.job.workers == () and t.job.executor_id is None
    assert t.effects == (StopOn(W, EPOCH, "gang_timeout", checkpoint_first=False),
                         LeaseFact(LeaseEventKind.RELEASED, EPOCH, "w0", reason="gang_timeout"))
    (ev,) = t.events
    assert ev.event is JobEventKind.BACKOFF and ev.detail["not_ready"] == ["w2"]
    assert ev.detail["delay_seconds"] == 10.5 and ev.detail["jitter"] == 0.5


def test_ready_timeout_before_the_deadline_changes_nothing():
    assert not decide(gang_job(), ReadyTimedOut(EPOCH, BACKOFF), DEADLINE - timedelta(seconds=1)).changed


def test_ready_timeout_after_the_limit_fails_the_job_with_gang_timeout():
    t = decide(gang_job(backoff_count=5), ReadyTimedOut(EPOCH, None), AFTER)
    assert t.job.state is JobState.FAILED and t.job.reason == "gang_timeout"
    assert t.events[-1].event is JobEventKind.FAILED and t.events[-1].reason == "gang_timeout"
    assert isinstance(t.effects[0], StopOn)


def test_backoff_requeues_at_its_time_keeping_its_count():
    job = gang_job(JobState.BACKOFF, backoff_count=2)
    assert not decide(job, AdmissionDue(), DEADLINE - timedelta(seconds=1)).changed
    t = decide(job, AdmissionDue(), DEADLINE)
    assert t.job.state is JobState.QUEUED and t.job.backoff_count == 2 and t.job.next_admission_at is None
    assert t.events[0].event is JobEventKind.REQUEUED and t.events[0].reason == "gang_timeout"


def test_cancel_while_admitting_stops_every_worker():
    t = decide(gang_job(), Cancel("enough", "ann"), T0)
    assert t.job.state is JobState.CANCELLED and t.effects[0] == StopOn(W, EPOCH, "cancelled", False)


def test_ceiling_while_admitting_interrupts_at_once_and_stops_every_worker():
    t = decide(gang_job(), StopForCeiling(600, 601), T0)
    assert t.job.state is JobState.INTERRUPTED and t.effects[0] == StopOn(W, EPOCH, "gpu_ceiling", False)


def test_each_worker_renews_its_own_lease_and_the_job_lease_is_the_earliest():
    job = running()
    later = LEASE + timedelta(seconds=6)
    for e in ("w0", "w1"):
        job = decide(job, Renew(e, EPOCH, later), T0).job
    assert job.lease_expires_at == LEASE  # w2 has not renewed
    job = decide(job, Renew("w2", EPOCH, later), T0).job
    assert job.lease_expires_at == later


def test_a_worker_whose_run_ended_cannot_renew():
    assert isinstance(decide(running(ended={1: "succeeded"}), Renew("w1", EPOCH, LEASE), T0), Refusal)


def test_steps_reported_while_forming_are_kept():
    t = decide(gang_job(ready=1), StepReported(EPOCH, step=3), T0)
    assert t.job.last_step == 3 and t.job.state is JobState.ADMITTING


# -- the run ----------------------------------------------------------------------------------------------

def test_the_gang_succeeds_when_every_worker_has():
    job = running()
    for e in W[:2]:
        job = decide(job, fin(e, RunOutcome.SUCCEEDED, 0), T0).job
        assert job.state is JobState.RUNNING
    t = decide(job, fin("w2", RunOutcome.SUCCEEDED, 0), T0)
    assert t.job.state is JobState.SUCCEEDED and t.effects[-1].event is LeaseEventKind.RELEASED


def test_a_training_failure_spends_an_attempt_and_stops_the_rest():
    t = decide(running(), fin("w1", RunOutcome.FAILED, 1), T0)
    assert t.job.state is JobState.QUEUED and t.job.attempts["training_error"] == 1
    assert StopOn(("w0", "w2"), EPOCH, "training_error", False) in t.effects


def test_peer_lost_waits_for_the_real_cause_a_training_failure():
    job = decide(running(), fin("w0", RunOutcome.FAILED, EXIT_PEER_LOST), T0).job
    job = decide(job, fin("w2", RunOutcome.FAILED, EXIT_PEER_LOST), T0).job
    assert job.state is JobState.RUNNING and job.attempts["training_error"] == 0
    t = decide(job, fin("w1", RunOutcome.FAILED, 1), T0)  # the crash that made the others lose their peer
    assert t.job.state is JobState.QUEUED and t.job.attempts["training_error"] == 1
    assert t.job.attempts["node_failure"] == 0


def test_peer_lost_waits_for_the_real_cause_a_silent_worker_whose_lease_expires():
    job = decide(running(), fin("w0", RunOutcome.FAILED, EXIT_PEER_LOST), T0).job
    job = decide(job, fin("w2", RunOutcome.FAILED, EXIT_PEER_LOST), T0).job
    job = decide(job, Renew("w1", EPOCH, LEASE), T0).job  # w1's agent died after this
    assert job.lease_expires_at == LEASE  # only w1's lease is watched now
    t = decide(job, LeaseExpired(EPOCH), LEASE + timedelta(seconds=1))
    assert t.job.state is JobState.QUEUED and t.job.attempts == {
        "training_error": 0, "transport_lost": 0, "node_failure": 1, "gang_timeout": 0,
        "handed_back": 0, "preempted": 0, "health_check": 0}
    assert [e.event for e in t.events] == [JobEventKind.WORKER_LOST, JobEventKind.REQUEUED]
    assert t.events[0].detail["lost"] == ["w1"] and t.events[1].reason == "node_failure"


def test_every_worker_losing_a_peer_is_a_node_failure():
    job = running()
    for e in W:
        t = decide(job, fin(e, RunOutcome.FAILED, EXIT_PEER_LOST), T0)
        job = t.job
    assert job.state is JobState.QUEUED and job.attempts["node_failure"] == 1


@pytest.mark.parametrize("strategy", ["requeue_gang", "fail_job"])
def test_an_abandoned_worker_applies_the_node_failure_strategy(strategy):
    t = decide(running(on_node_failure=strategy), fin("w2", RunOutcome.ABANDONED), T0)
    assert t.job.state is (JobState.QUEUED if strategy == "requeue_gang" else JobState.FAILED)
    assert t.effects[0] == StopOn(("w0", "w1"), EPOCH, "node_failure", checkpoint_first=False)
    assert t.job.attempts["training_error"] == 0
    if strategy == "fail_job":
        assert t.job.reason == "node_failure"


@pytest.mark.parametrize("strategy", ["requeue_gang", "fail_job"])
@pytest.mark.parametrize("state", [JobState.ADMITTING, JobState.RUNNING], ids=str)
def test_a_worker_handing_its_grant_back_requeues_the_gang_as_a_hand_back_whatever_the_strategy(state, strategy):
    job = gang_job(state, ready=3 if state is JobState.RUNNING else 0, on_node_failure=strategy)
    t = decide(job, Finished(EPOCH, RunOutcome.HANDED_BACK, error="not started: checking", executor_id="w2"), T0)
    assert t.job.state is JobState.QUEUED and t.job.gang == () and t.job.workers == ()
    assert t.job.attempts["handed_back"] == 1
    assert t.job.attempts["node_failure"] == 0 and t.job.attempts["transport_lost"] == 0
    assert t.effects[0] == StopOn(("w0", "w1"), EPOCH, "handed_back", checkpoint_first=False)
    assert t.events[-1].event is JobEventKind.REQUEUED and t.events[-1].reason == "handed_back"


def test_a_lease_expiry_before_any_worker_is_late_changes_nothing():
    assert not decide(running(), LeaseExpired(EPOCH), LEASE - timedelta(seconds=1)).changed


def test_under_a_ceiling_stop_the_gang_is_interrupted_when_every_worker_has_stopped():
    job = running(stop_requested="gpu_ceiling")
    for e in W[:2]:
        job = decide(job, fin(e, RunOutcome.STOPPED), T0).job
        assert job.state is JobState.RUNNING
    t = decide(job, fin("w2", RunOutcome.STOPPED), T0)
    assert t.job.state is JobState.INTERRUPTED and t.job.reason == "gpu_ceiling"


def test_a_node_failure_under_a_ceiling_stop_interrupts():
    t = decide(running(stop_requested="gpu_ceiling"), LeaseExpired(EPOCH), LEASE + timedelta(seconds=1))
    assert t.job.state is JobState.INTERRUPTED


def test_a_worker_ending_twice_is_counted_once():
    job = decide(running(), fin("w0", RunOutcome.SUCCEEDED, 0), T0).job
    assert not decide(job, fin("w0", RunOutcome.SUCCEEDED, 0), T0).changed


def test_a_failed_node_under_a_running_gang_applies_the_strategy_at_once():
    t = decide(running(), NodeFailed("w1", "ecc errors"), T0)
    assert t.job.state is JobState.QUEUED and t.job.attempts["node_failure"] == 1
    assert t.events[0].event is JobEventKind.WORKER_LOST and t.events[0].reason == "node failed: ecc errors"
    assert t.effects[0] == StopOn(("w0", "w2"), EPOCH, "node_failure", checkpoint_first=False)


def test_a_failed_node_whose_worker_already_ended_changes_nothing():
    assert not decide(running(ended={1: "succeeded"}), NodeFailed("w1", "x"), T0).changed
