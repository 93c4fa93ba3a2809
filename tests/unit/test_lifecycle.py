"""The job lifecycle over its whole state space: every (state, fact) pair, then the rules one by one."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from libs.contracts.jobs import TERMINAL_STATES, JobEventKind, JobSpec, JobState
from libs.contracts.leases import LeaseEventKind
from libs.contracts.telemetry import HEALTH_CHECK_STOP, RunOutcome
from services.queue.domain.lifecycle import (
    CEILING_STOP,
    Cancel,
    CheckpointSkipped,
    Checkpointed,
    Finished,
    Granted,
    LeaseExpired,
    LeaseFact,
    Refusal,
    Renew,
    Undeliverable,
    Requeue,
    RunOn,
    Started,
    StepReported,
    StopForCeiling,
    StopOn,
    StoreNoted,
    Submitted,
    Transition,
    decide,
)
from tests.support import builders
from tests.support.builders import EPOCH, EX, T0

pytestmark = pytest.mark.unit

LATER = T0 + timedelta(seconds=10)

FACTS = {
    "submitted": lambda: Submitted("j1", "demo", "ann", JobSpec(workload={"kind": "finetune"})),
    "granted": lambda: Granted((EX,), EPOCH + 1, LATER + timedelta(seconds=6)),
    "renew": lambda: Renew(EX, EPOCH, LATER + timedelta(seconds=6)),
    "started": lambda: Started(EPOCH, resumed_from_step=10),
    "step": lambda: StepReported(EPOCH, step=12, total_steps=100, step_seconds=0.5),
    "checkpointed": lambda: Checkpointed(EPOCH, step=20, path="/c/step-20.pt", at=LATER, sha256="ab", bytes=9),
    "checkpoint_skipped": lambda: CheckpointSkipped(EPOCH, path="/c/step-30.pt", reason="sha256 mismatch"),
    "store_uploading": lambda: StoreNoted(EPOCH, "uploading", {"store": "s3://b", "step": 40, "behind": 2}),
    "store_waiting": lambda: StoreNoted(EPOCH, "waiting", {"store": "s3://b", "reason": "connection refused"}),
    "finished_succeeded": lambda: Finished(EPOCH, RunOutcome.SUCCEEDED, exit_code=0),
    "finished_failed": lambda: Finished(EPOCH, RunOutcome.FAILED, exit_code=3, error="boom"),
    "finished_abandoned": lambda: Finished(EPOCH, RunOutcome.ABANDONED),
    "finished_stopped": lambda: Finished(EPOCH, RunOutcome.STOPPED),
    "finished_handed_back": lambda: Finished(EPOCH, RunOutcome.HANDED_BACK, error="not started: busy"),
    "finished_health_check": lambda: Finished(EPOCH, RunOutcome.STOPPED, last_step=40, stop_reason=HEALTH_CHECK_STOP),
    "lease_expired": lambda: LeaseExpired(EPOCH),
    "cancel": lambda: Cancel("no longer needed", "ann"),
    "stop_for_ceiling": lambda: StopForCeiling(ceiling_seconds=600, consumed_seconds=601),
    "requeue": lambda: Requeue(new_ceiling=1000, consumed=601, actor="op"),
    "requeue_too_low": lambda: Requeue(new_ceiling=650, consumed=601, actor="op"),
    "undeliverable": lambda: Undeliverable("teto.job.j1.submitted: payload 2000000 bytes over the 1048576 limit"),
}
RUN_FACTS = ("started", "step", "checkpointed", "checkpoint_skipped", "store_uploading", "store_waiting",
             "finished_succeeded", "finished_failed",
             "finished_abandoned", "finished_stopped", "finished_handed_back", "finished_health_check",
             "lease_expired")

NON_TERMINAL = [s for s in JobState if s not in TERMINAL_STATES]
REFUSED, UNCHANGED = "refused", "unchanged"


def expected(state: JobState, fact: str) -> str | JobState:
    """The rule book, written as a table: what each fact does to a job in each state (current epoch).

    An admitting job is a gang (the facts here name no worker, so its workers' ends change nothing; the gang
    rules have their own table in test_gang_lifecycle.py)."""
    running = state is JobState.RUNNING
    admitting = state is JobState.ADMITTING
    if fact == "submitted":
        return REFUSED  # the job exists already
    if fact == "granted":
        return JobState.RUNNING if state is JobState.QUEUED else REFUSED
    if fact == "renew":
        return state if running or admitting else REFUSED
    if fact in ("started", "step", "checkpointed", "checkpoint_skipped", "store_uploading", "store_waiting"):
        return state if running or admitting else UNCHANGED
    if fact == "finished_succeeded":
        return JobState.SUCCEEDED if running else UNCHANGED
    if fact in ("finished_failed", "finished_abandoned", "finished_stopped", "finished_handed_back",
                "finished_health_check", "lease_expired"):
        return JobState.QUEUED if running else UNCHANGED
    if fact == "cancel":
        return REFUSED if state in TERMINAL_STATES else JobState.CANCELLED
    if fact == "stop_for_ceiling":
        if state in TERMINAL_STATES or state is JobState.INTERRUPTED:
            return UNCHANGED
        return JobState.RUNNING if running else JobState.INTERRUPTED
    if fact == "requeue":
        return JobState.QUEUED if state is JobState.INTERRUPTED else REFUSED
    if fact == "requeue_too_low":
        return REFUSED
    if fact == "undeliverable":
        return UNCHANGED if state in TERMINAL_STATES else JobState.FAILED
    raise AssertionError(fact)


PAIRS = [(s, f) for s in JobState for f in FACTS]


@pytest.mark.parametrize(("state", "fact"), PAIRS, ids=[f"{s.name} => {f}" for s, f in PAIRS])
def test_every_state_and_fact(state: JobState, fact: str):
    job = builders.job(state)
    result = decide(job, FACTS[fact](), LATER)
    want = expected(state, fact)
    if want == REFUSED:
        assert isinstance(result, Refusal) and result.reason
    elif want == UNCHANGED:
        assert isinstance(result, Transition) and not result.changed
        assert result.job == job and result.events == () and result.effects == () and result.ignored
    else:
        assert isinstance(result, Transition) and result.changed
        assert result.job.state is want
        for ev in result.events:  # every event names the state it leaves the job in, in order
            assert ev.state in (want, state, JobState.RUNNING)
        if result.events:
            assert result.events[-1].state is want


STALE = [(s, f) for s in JobState for f in RUN_FACTS]


@pytest.mark.parametrize(("state", "fact"), STALE, ids=[f"{s.name} => stale {f}" for s, f in STALE])
def test_a_fact_from_an_older_epoch_changes_nothing(state: JobState, fact: str):
    job = builders.job(state)
    result = decide(job, replace(FACTS[fact](), epoch=EPOCH - 1), LATER)
    assert result == Transition.stale_epoch(job, EPOCH - 1) and result.stale and not result.changed
    assert "stale epoch" in result.ignored


# -- submit and grant -------------------------------------------------------------------------------------

def test_submit_makes_a_queued_job_and_a_submitted_event_with_spec_owner_and_name():
    spec = JobSpec(workload={"kind": "finetune"}, gpu_ceiling_seconds=900)
    t = decide(None, Submitted("j9", "mine", "bob", spec), T0)
    assert t.job.state is JobState.QUEUED and t.job.owner == "bob" and t.job.lease_epoch == 0
    assert t.job.attempts == {"training_error": 0, "transport_lost": 0, "node_failure": 0, "gang_timeout": 0,
                              "handed_back": 0, "preempted": 0, "health_check": 0}
    (ev,) = t.events
    assert ev.event is JobEventKind.SUBMITTED and ev.previous_state is None
    assert ev.detail == {"spec": spec.model_dump(mode="json"), "owner": "bob", "name": "mine", "org": "default"}
    assert t.job.ceiling_history[0]["ceiling_seconds"] == 900 and t.job.ceiling_history[0]["actor"] == "bob"


def test_a_fact_about_an_unknown_job_is_refused():
    assert decide(None, Cancel("x", "ann"), T0) == Refusal("no such job")


def test_grant_runs_the_job_under_the_next_epoch_and_tells_the_executor():
    expires = LATER + timedelta(seconds=6)
    t = decide(builders.job(JobState.QUEUED), Granted((EX,), EPOCH + 1, expires), LATER)
    assert t.job.state is JobState.RUNNING and t.job.lease_epoch == EPOCH + 1
    assert t.job.attempt_number == EPOCH + 1 and t.job.executor_id == EX and t.job.lease_expires_at == expires
    assert [e.event for e in t.events] == [JobEventKind.LEASED]
    assert t.effects == (RunOn((EX,), EPOCH + 1, EPOCH + 1), LeaseFact(LeaseEventKind.GRANTED, EPOCH + 1, EX, expires))


@pytest.mark.parametrize("epoch", [EPOCH, EPOCH + 2], ids=["same epoch", "skipped epoch"])
def test_a_grant_with_any_epoch_but_the_next_is_refused(epoch):
    assert isinstance(decide(builders.job(), Granted((EX,), epoch, LATER), LATER), Refusal)


def test_a_gang_grant_holds_every_worker():
    t = decide(builders.job(), Granted(("a", "b"), EPOCH + 1, LATER), LATER)
    assert t.job.workers == ("a", "b") and t.job.executor_id == "a" and t.effects[0].workers == ("a", "b")
    assert t.job.state is JobState.ADMITTING and [w.executor_id for w in t.job.gang] == ["a", "b"]


# -- renewal ----------------------------------------------------------------------------------------------

def test_renewal_extends_the_lease_without_an_event():
    new_expiry = LATER + timedelta(seconds=6)
    t = decide(builders.job(JobState.RUNNING), Renew(EX, EPOCH, new_expiry), LATER)
    assert t.job.lease_expires_at == new_expiry and t.events == () and t.effects == ()


@pytest.mark.parametrize(("job", "fact", "reason"), [
    (builders.job(JobState.RUNNING), Renew(EX, EPOCH - 1, LATER), "stale epoch"),
    (builders.job(JobState.RUNNING), Renew("ex-other", EPOCH, LATER), "another executor"),
    (builders.job(JobState.CANCELLED), Renew(EX, EPOCH, LATER), "job cancelled"),
    (builders.job(JobState.SUCCEEDED), Renew(EX, EPOCH, LATER), "job ended"),
    (builders.job(JobState.QUEUED), Renew(EX, EPOCH, LATER), "job ended"),
], ids=["stale epoch", "other executor", "cancelled", "succeeded", "requeued"])
def test_renewal_refusals_say_why(job, fact, reason):
    result = decide(job, fact, LATER)
    assert isinstance(result, Refusal) and reason in result.reason


# -- progress ---------------------------------------------------------------------------------------------

def test_started_records_where_the_run_resumed():
    t = decide(builders.job(JobState.RUNNING, last_step=40), Started(EPOCH, resumed_from_step=30, device="cuda"), LATER)
    (ev,) = t.events
    assert ev.event is JobEventKind.STARTED and ev.detail["resumed_from_step"] == 30 and ev.detail["device"] == "cuda"
    assert t.job.last_step == 30


def test_steps_update_the_job_without_events_and_keep_a_step_weighted_mean():
    job = builders.job(JobState.RUNNING)
    t1 = decide(job, StepReported(EPOCH, step=10, total_steps=100, step_seconds=1.0), LATER)
    t2 = decide(t1.job, StepReported(EPOCH, step=40, total_steps=100, step_seconds=2.0), LATER)
    assert t1.events == () and t2.events == ()
    assert t2.job.last_step == 40 and t2.job.total_steps == 100
    assert t2.job.step_seconds == pytest.approx((10 * 1.0 + 30 * 2.0) / 40) and t2.job.step_samples == 40


def test_checkpoint_is_recorded_on_the_job_and_announced():
    t = decide(builders.job(JobState.RUNNING), FACTS["checkpointed"](), LATER)
    assert t.job.last_checkpoint == {"step": 20, "path": "/c/step-20.pt", "sha256": "ab", "bytes": 9,
                                     "at": LATER.isoformat(), "epoch": EPOCH,  # the epoch it was accepted under
                                     "kind": "file"}
    assert [e.event for e in t.events] == [JobEventKind.CHECKPOINTED]


def test_a_directory_checkpoint_is_recorded_with_its_kind_size_and_files():
    fact = Checkpointed(EPOCH, 20, "/c/checkpoint-20", LATER, "ab", 900, "directory", 7)
    t = decide(builders.job(JobState.RUNNING), fact, LATER)
    assert {k: t.job.last_checkpoint[k] for k in ("kind", "bytes", "files", "path")} == {
        "kind": "directory", "bytes": 900, "files": 7, "path": "/c/checkpoint-20"}
    (ev,) = t.events
    assert ev.detail["kind"] == "directory" and ev.detail["files"] == 7


def test_checkpoint_skipped_is_an_event_with_the_reason():
    (ev,) = decide(builders.job(JobState.RUNNING), FACTS["checkpoint_skipped"](), LATER).events
    assert ev.event is JobEventKind.CHECKPOINT_SKIPPED and ev.reason == "sha256 mismatch"


# -- the run ends -----------------------------------------------------------------------------------------

def test_success_releases_the_lease():
    t = decide(builders.job(JobState.RUNNING), FACTS["finished_succeeded"](), LATER)
    assert t.job.state is JobState.SUCCEEDED and t.job.workers == () and t.job.executor_id == EX
    assert t.effects == (LeaseFact(LeaseEventKind.RELEASED, EPOCH, EX, reason="succeeded"),)


def test_training_failures_spend_attempts_until_the_job_fails_with_the_last_error():
    job = builders.job(JobState.RUNNING, lease_epoch=1)
    for n in (1, 2):
        t = decide(job, Finished(job.lease_epoch, RunOutcome.FAILED, exit_code=1, error=f"err {n}"), LATER)
        assert t.job.state is JobState.QUEUED and t.job.attempts["training_error"] == n
        assert [e.event for e in t.events] == [JobEventKind.ATTEMPT_FAILED, JobEventKind.REQUEUED]
        job = decide(t.job, Granted((EX,), job.lease_epoch + 1, LATER), LATER).job
    t = decide(job, Finished(job.lease_epoch, RunOutcome.FAILED, exit_code=1, error="err 3"), LATER)
    assert t.job.state is JobState.FAILED and t.job.reason == "err 3" and t.job.error == "err 3"
    assert t.job.attempts["training_error"] == 3 and t.job.attempts["transport_lost"] == 0
    assert [e.event for e in t.events] == [JobEventKind.ATTEMPT_FAILED, JobEventKind.FAILED]


def test_a_failure_without_error_text_names_the_exit_code():
    t = decide(builders.job(JobState.RUNNING), Finished(EPOCH, RunOutcome.FAILED, exit_code=3), LATER)
    assert t.job.error == "exit code 3"


@pytest.mark.parametrize("fact", ["lease_expired", "finished_abandoned", "finished_stopped"])
def test_losing_the_run_requeues_without_spending_a_training_attempt(fact):
    t = decide(builders.job(JobState.RUNNING), FACTS[fact](), LATER)
    assert t.job.state is JobState.QUEUED and t.job.executor_id is None and t.job.workers == ()
    assert t.job.attempts["transport_lost"] == 1 and t.job.attempts["training_error"] == 0
    assert t.events[-1].event is JobEventKind.REQUEUED and t.events[-1].reason == "transport_lost"


def test_a_hand_back_requeues_free_and_counts_as_a_hand_back_never_as_a_transport_loss():
    t = decide(builders.job(JobState.RUNNING), FACTS["finished_handed_back"](), LATER)
    assert t.job.state is JobState.QUEUED and t.job.executor_id is None and t.job.workers == ()
    assert t.job.attempts["handed_back"] == 1
    assert t.job.attempts["transport_lost"] == 0 and t.job.attempts["training_error"] == 0
    assert [e.event for e in t.events] == [JobEventKind.ABANDONED, JobEventKind.REQUEUED]
    assert t.events[0].reason == "handed back: not started: busy" and t.events[-1].reason == "handed_back"
    assert t.effects == (LeaseFact(LeaseEventKind.RELEASED, EPOCH, EX, reason="handed back: not started: busy"),)
    again = decide(replace(t.job, state=JobState.RUNNING, lease_epoch=EPOCH, executor_id=EX, workers=(EX,)),
                   FACTS["finished_handed_back"](), LATER)
    assert again.job.attempts["handed_back"] == 2 and again.job.attempts["transport_lost"] == 0


def test_a_forced_health_check_stop_requeues_free_under_its_own_cause_never_as_a_transport_loss():
    """Issue 26: an operator's `teto nodes check --force` stopped a job, and its attempts said "transport loss"."""
    t = decide(builders.job(JobState.RUNNING), FACTS["finished_health_check"](), LATER)
    assert t.job.state is JobState.QUEUED and t.job.executor_id is None and t.job.last_step == 40
    assert t.job.attempts["health_check"] == 1
    assert t.job.attempts["transport_lost"] == 0 and t.job.attempts["training_error"] == 0
    assert [e.event for e in t.events] == [JobEventKind.ABANDONED, JobEventKind.REQUEUED]
    assert t.events[0].reason == "health_check" and t.events[-1].reason == "health_check"
    assert t.effects == (LeaseFact(LeaseEventKind.RELEASED, EPOCH, EX, reason="health_check"),)
    other = decide(builders.job(JobState.RUNNING), Finished(EPOCH, RunOutcome.STOPPED, stop_reason="something else"),
                   LATER)
    assert other.job.attempts["transport_lost"] == 1 and other.job.attempts["health_check"] == 0


def test_lease_expiry_is_announced_then_requeued():
    t = decide(builders.job(JobState.RUNNING), LeaseExpired(EPOCH), LATER)
    assert [e.event for e in t.events] == [JobEventKind.LEASE_EXPIRED, JobEventKind.REQUEUED]
    assert t.effects == (LeaseFact(LeaseEventKind.EXPIRED, EPOCH, EX, reason="lease expired"),)


# -- GPU ceiling ------------------------------------------------------------------------------------------

def test_ceiling_asks_a_running_job_to_checkpoint_and_stop_once():
    t = decide(builders.job(JobState.RUNNING), FACTS["stop_for_ceiling"](), LATER)
    assert t.job.state is JobState.RUNNING and t.job.stop_requested == CEILING_STOP
    assert t.effects == (StopOn((EX,), EPOCH, CEILING_STOP, checkpoint_first=True),)
    assert [e.event for e in t.events] == [JobEventKind.STOP_REQUESTED]
    again = decide(t.job, FACTS["stop_for_ceiling"](), LATER)
    assert not again.changed and again.effects == ()


@pytest.mark.parametrize(("fact", "label", "spent"), [
    ("finished_stopped", CEILING_STOP, 0),  # it stopped as asked: the ceiling is the story
    ("finished_failed", "run_failed", 1),  # it failed on its own first: a failure, an attempt spent
    ("finished_abandoned", "run_abandoned", 0),
    ("finished_handed_back", "run_never_started", 0),
    ("lease_expired", "run_lost", 0),
], ids=["stopped", "failed", "abandoned", "handed-back", "lease-expired"])
def test_after_a_ceiling_stop_the_run_ending_any_way_but_success_interrupts_the_job_labelled_as_it_ended(
        fact, label, spent):
    job = replace(builders.job(JobState.RUNNING), stop_requested=CEILING_STOP)
    t = decide(job, FACTS[fact](), LATER)
    assert t.job.state is JobState.INTERRUPTED and t.job.reason == label
    assert t.job.attempts["training_error"] == spent and t.job.attempts["transport_lost"] == 0
    assert t.events[-1].event is JobEventKind.INTERRUPTED and t.events[-1].reason == label
    assert t.events[-1].detail["ceiling"] is True  # interrupted because the ceiling is reached, all the same
    if spent:
        assert t.job.error == "boom" and t.events[-1].detail["error"] == "boom"


def test_success_after_a_ceiling_stop_is_still_success():
    job = replace(builders.job(JobState.RUNNING), stop_requested=CEILING_STOP)
    assert decide(job, FACTS["finished_succeeded"](), LATER).job.state is JobState.SUCCEEDED


def test_exhaustion_of_an_earlier_ceiling_is_old_news():
    job = builders.job(JobState.RUNNING, spec=JobSpec(workload={"kind": "finetune"}, gpu_ceiling_seconds=2000))
    t = decide(job, StopForCeiling(ceiling_seconds=600, consumed_seconds=601), LATER)
    assert not t.changed and "earlier ceiling" in t.ignored


def test_requeue_with_too_low_a_ceiling_is_refused_with_the_numbers():
    result = decide(builders.job(JobState.INTERRUPTED), Requeue(new_ceiling=650, consumed=601, actor="op"), LATER)
    assert isinstance(result, Refusal)
    assert result.detail == {"consumed_seconds": 601, "minimum_seconds": 661, "given_seconds": 650}


def test_requeue_exactly_at_the_minimum_is_accepted_and_recorded():
    job = builders.job(JobState.INTERRUPTED, reason=CEILING_STOP, executor_id=EX)
    t = decide(job, Requeue(new_ceiling=661, consumed=601, actor="op"), LATER)
    assert t.job.state is JobState.QUEUED and t.job.spec.gpu_ceiling_seconds == 661 and t.job.reason is None
    assert t.job.ceiling_history[-1] == {"ceiling_seconds": 661, "actor": "op", "at": LATER.isoformat()}
    (ev,) = t.events
    assert ev.event is JobEventKind.REQUEUED and ev.detail["gpu_ceiling_seconds"] == 661
    assert ev.detail["actor"] == "op" and ev.detail["previous_ceiling_seconds"] == 600


# -- cancel -----------------------------------------------------------------------------------------------

def test_cancel_of_a_running_job_is_immediate_and_stops_the_process():
    t = decide(builders.job(JobState.RUNNING), Cancel("enough", "ann"), LATER)
    assert t.job.state is JobState.CANCELLED and t.job.reason == "enough" and t.job.workers == ()
    assert StopOn((EX,), EPOCH, "cancelled", checkpoint_first=False) in t.effects
    assert t.events[0].detail == {"actor": "ann"}


@pytest.mark.parametrize("state", [s for s in NON_TERMINAL if s not in (JobState.RUNNING, JobState.ADMITTING)],
                         ids=str)
def test_cancel_of_a_job_not_running_stops_nothing(state):
    t = decide(builders.job(state), Cancel("enough", "ann"), LATER)
    assert t.job.state is JobState.CANCELLED and t.effects == ()


@pytest.mark.parametrize("state", sorted(TERMINAL_STATES), ids=str)
def test_cancel_of_a_finished_job_says_it_is_over(state):
    result = decide(builders.job(state), Cancel("enough", "ann"), LATER)
    assert isinstance(result, Refusal) and result.reason == f"job already {state}"


@pytest.mark.parametrize("state", [JobState.RUNNING, JobState.ADMITTING], ids=str)
def test_an_undeliverable_job_that_runs_is_stopped_and_its_lease_released(state: JobState):
    job = builders.job(state)
    t = decide(job, FACTS["undeliverable"](), LATER)
    assert t.job.state is JobState.FAILED and "undeliverable" in (t.job.reason or "")
    assert any(isinstance(e, StopOn) for e in t.effects)
    assert any(isinstance(e, LeaseFact) and e.event is LeaseEventKind.RELEASED for e in t.effects)


def test_a_checkpoint_uploading_is_shown_never_accepted():
    job = builders.job(JobState.RUNNING, last_checkpoint={"step": 10, "epoch": EPOCH})
    result = decide(job, FACTS["store_uploading"](), LATER)
    assert result.job.last_checkpoint == {"step": 10, "epoch": EPOCH}  # resume, cost and cadence stay on step 10
    (event,) = result.events
    assert event.event is JobEventKind.CHECKPOINT_UPLOADING and event.detail == {"store": "s3://b", "step": 40,
                                                                                "behind": 2}
    (event,) = decide(job, FACTS["store_waiting"](), LATER).events
    assert event.event is JobEventKind.CHECKPOINT_STORE_WAITING and event.reason == "connection refused"


def test_a_stored_checkpoint_says_so_with_its_upload_time():
    job = builders.job(JobState.RUNNING)
    fact = Checkpointed(EPOCH, step=20, path="s3://b/j1/manifests/step-00000020-e3.json", at=LATER, sha256="ab",
                        bytes=9, upload_seconds=1.23456)
    result = decide(job, fact, LATER)
    assert result.job.last_checkpoint["state"] == "stored" and result.job.last_checkpoint["upload_seconds"] == 1.235
    plain = decide(job, FACTS["checkpointed"](), LATER).job.last_checkpoint
    assert "state" not in plain and "upload_seconds" not in plain  # the checkpoint directory: as before
