"""The checkpoint ETA rule (services/gateway/domain/eta.py): a number only while the job runs, its step time is
measured and its step advances; otherwise null with the reason (issue 26: a stuck job said "in 5 s" for
minutes; an interrupted job said "unknown until a step time is measured" beside a measured step time)."""

from __future__ import annotations

import pytest

from services.gateway.domain.eta import Eta, EtaStatus, next_eta, step_standing
from services.gateway.domain.views import checkpoint_block, job_view

pytestmark = pytest.mark.unit

FRESH = {"signal": "ok", "seconds_since_step_change": 1.0, "no_signal_after_seconds": 10.0, "epoch": 2}


def running(**over):
    return {"state": "running", "next_step": 100, "last_step": 60, "step_seconds": 0.25, "signal": FRESH,
            "lease_epoch": 2, **over}


def test_a_running_job_whose_step_advances_has_a_number():
    assert next_eta(**running()) == Eta(10.0, EtaStatus.ESTIMATED)


@pytest.mark.parametrize("state", ["queued", "admitting", "interrupted", "backoff", "succeeded", "failed",
                                   "cancelled"])
def test_no_checkpoint_is_coming_when_the_job_is_not_running_whatever_step_time_it_measured(state):
    assert next_eta(**running(state=state)) == Eta(None, EtaStatus.NOT_RUNNING)


@pytest.mark.parametrize("step_seconds", [None, float("nan"), float("inf"), -1.0, "0.5", True])
def test_unknown_until_a_step_time_is_measured(step_seconds):
    assert next_eta(**running(step_seconds=step_seconds)) == Eta(None, EtaStatus.NOT_MEASURED)


def test_nothing_due_comes_first():
    assert next_eta(**running(next_step=None, state="interrupted")) == Eta(None, EtaStatus.NONE_DUE)


@pytest.mark.parametrize("signal", ["stuck", "no_signal"])
def test_a_stuck_or_silent_job_has_no_eta(signal):
    assert next_eta(**running(signal={**FRESH, "signal": signal})) == Eta(None, EtaStatus.STANDING)


@pytest.mark.parametrize(("still", "standing"), [
    (9.9, False),   # within the silence allowance (10 s: steps are seen once a heartbeat)
    (10.0, False),  # at it
    (10.1, True),   # past it and past two step times
])
def test_a_step_standing_longer_than_the_allowance_has_no_eta_before_the_stuck_signal(still, standing):
    got = next_eta(**running(signal={**FRESH, "seconds_since_step_change": still}))
    assert got.status is (EtaStatus.STANDING if standing else EtaStatus.ESTIMATED)


def test_slow_steps_are_given_two_step_times_before_they_count_as_standing():
    slow = running(step_seconds=30.0, signal={**FRESH, "seconds_since_step_change": 45.0})
    assert next_eta(**slow).status is EtaStatus.ESTIMATED
    assert next_eta(**{**slow, "signal": {**FRESH, "seconds_since_step_change": 61.0}}).status is EtaStatus.STANDING


def test_a_reading_about_another_run_says_nothing_about_this_one():
    other = {**FRESH, "seconds_since_step_change": 500.0, "epoch": 1}
    assert next_eta(**running(signal=other)).status is EtaStatus.ESTIMATED
    assert step_standing(None, 0.25, 2) is False
    assert step_standing({**other, "signal": "stuck"}, 0.25, 2) is True  # the signal is the job's own


def test_the_budget_services_eta_stands_in_only_while_the_step_moves():
    spec = {"checkpoint_every_steps": 50}
    job = {"state": "running", "last_step": 60, "total_steps": 300, "step_seconds": None, "lease_epoch": 2,
           "last_checkpoint": {"step": 50}}
    assert checkpoint_block(spec, job, FRESH, 4.5)["next_eta_seconds"] == 4.5
    stuck = checkpoint_block(spec, job, {**FRESH, "signal": "stuck"}, 4.5)
    assert (stuck["next_eta_seconds"], stuck["next_eta_status"]) == (None, "standing")
    assert checkpoint_block(spec, {**job, "state": "interrupted"}, FRESH, 4.5)["next_eta_status"] == "not_running"


def test_the_job_view_reads_the_jobs_own_signal():
    job = {"id": "j", "state": "running", "spec": {"checkpoint_every_steps": 50}, "last_step": 60,
           "step_seconds": 0.5, "lease_epoch": 3}
    signal = {"signal": "stuck", "signal_since": "t", "executor_id": "e",
              "detail": {"seconds_since_step_change": 300.0, "no_signal_after_seconds": 60.0, "epoch": 3}}
    stuck = job_view(job, signal=signal)["checkpoint"]
    assert (stuck["next_eta_seconds"], stuck["next_eta_status"]) == (None, "standing")
    moving = job_view(job, signal={**signal, "signal": "ok", "detail": {**signal["detail"],
                                                                        "seconds_since_step_change": 2.0}})
    assert (moving["checkpoint"]["next_eta_seconds"], moving["checkpoint"]["next_eta_status"]) == (20.0, "estimated")
