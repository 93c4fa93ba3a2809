"""Provisional consumption and the cost of an interruption: pure arithmetic on the budget service's facts and
the queue's job row (services/gateway/domain/live.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.gateway.domain.live import (NONE, Provisional, gpu_seconds_after, interruption_cost, live_budget,
                                          provisional)
from services.gateway.domain.views import job_view, with_previous

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def budget(**kw):
    row = {"epoch": 3, "devices": 2, "running_since": at(0), "last_sample_at": at(30), "run_closed": False,
           "read_at": at(42), "ceiling_seconds": 1000.0, "consumed_seconds": 60.0}
    return {**row, **kw}


def test_a_running_job_shows_the_stretch_since_its_last_sample_times_its_devices():
    assert provisional("running", 3, budget()) == Provisional(24.0, at(30), 2)  # 12 s x 2 devices


def test_before_the_first_sample_the_stretch_starts_when_the_run_did():
    assert provisional("running", 3, budget(last_sample_at=None, read_at=at(5))) == Provisional(10.0, at(0), 2)


def test_a_sample_from_before_the_run_started_does_not_stretch_it():
    # A sample of this epoch recorded before the running event was applied (they travel apart).
    assert provisional("running", 3, budget(last_sample_at=at(-4), read_at=at(1))).since == at(0)


@pytest.mark.parametrize("state", ["queued", "admitting", "interrupted", "backoff", "succeeded", "failed",
                                   "cancelled"])
def test_only_a_running_job_has_a_provisional_stretch(state):
    assert provisional(state, 3, budget()) == NONE


@pytest.mark.parametrize("change", [
    {"epoch": 2},  # the budget service has not heard of this run yet: its last sample is the previous run's
    {"run_closed": True},  # the process exited: all its time is in the ledger
    {"last_sample_at": None, "running_since": None},  # nothing known about when it started
    {"read_at": None},
], ids=["older-epoch", "closed", "no-start", "no-clock"])
def test_no_stretch_when_the_facts_cannot_support_one(change):
    assert provisional("running", 3, budget(**change)) == NONE


def test_no_budget_row_or_no_epoch_means_no_stretch():
    assert provisional("running", 3, None) == NONE and provisional("running", None, budget()) == NONE


def test_a_clock_reading_before_the_sample_is_no_negative_time():
    assert provisional("running", 3, budget(read_at=at(29))).seconds == 0.0


def test_a_cpu_only_job_counts_one_device():
    assert provisional("running", 3, budget(devices=0)).seconds == 12.0


def test_the_live_budget_keeps_the_ledger_figures_and_adds_the_provisional_ones():
    block = {"ceiling_seconds": 100.0, "consumed_seconds": 90.0, "remaining_seconds": 10.0}
    out = live_budget(block, Provisional(24.0, at(30), 2))
    assert out["consumed_seconds"] == 90.0 and out["remaining_seconds"] == 10.0  # the ledger's, unchanged
    assert (out["provisional_seconds"], out["consumed_live_seconds"], out["remaining_live_seconds"]) == (24.0, 114.0,
                                                                                                        0.0)
    assert out["provisional_since"] == at(30) and out["provisional_devices"] == 2
    assert live_budget({"ceiling_seconds": None, "consumed_seconds": 1.0}, NONE)["remaining_live_seconds"] is None


def sample(start: float, end: float, gpu: float, recorded: float | None = None):
    return {"started_at": at(start), "ended_at": at(end), "gpu_seconds": gpu,
            "recorded_at": at(recorded if recorded is not None else end)}


def test_samples_after_a_checkpoint_count_whole_and_the_straddling_one_for_its_part():
    samples = [sample(0, 30, 60.0), sample(30, 60, 60.0), sample(60, 90, 60.0)]
    assert gpu_seconds_after(samples, at(45)) == pytest.approx(30.0 + 60.0)  # half of the second, all the third
    assert gpu_seconds_after(samples, at(90)) == 0.0
    assert gpu_seconds_after(samples, at(-10)) == 180.0  # a checkpoint of an earlier run: this run all counts
    assert gpu_seconds_after(samples, None) == 180.0  # no checkpoint: everything


def test_a_sample_without_its_stretch_counts_by_when_it_was_recorded():
    old = [{"gpu_seconds": 5.0, "recorded_at": at(10)}, {"gpu_seconds": 7.0, "recorded_at": at(50)}]
    assert gpu_seconds_after(old, at(30)) == 7.0


def test_a_zero_length_sample_after_its_start_counts_whole():
    assert gpu_seconds_after([sample(40, 40, 1.0)], at(30)) == 1.0


RUNNING = {"state": "running", "last_step": 130, "lease_epoch": 3,
           "last_checkpoint": {"step": 100, "at": at(45).isoformat()}}


def test_an_interruption_now_costs_the_steps_and_gpu_time_since_the_checkpoint_plus_the_provisional_stretch():
    samples = [sample(0, 30, 60.0), sample(30, 60, 60.0)]
    cost = interruption_cost(RUNNING, samples, Provisional(24.0, at(60), 2))
    assert cost == {"kind": "at_risk", "steps": 30, "gpu_seconds": 54.0, "provisional_seconds": 24.0,
                    "checkpoint_step": 100, "checkpoint_at": at(45).isoformat(), "last_step": 130, "epoch": 3}


def test_an_interrupted_job_shows_what_its_interruption_threw_away_without_a_provisional_part():
    job = {**RUNNING, "state": "interrupted"}
    cost = interruption_cost(job, [sample(0, 30, 60.0), sample(30, 60, 60.0)], Provisional(24.0, at(60), 2))
    assert cost["kind"] == "lost" and cost["gpu_seconds"] == 30.0 and cost["provisional_seconds"] == 0.0


def test_without_a_checkpoint_everything_since_the_run_started_is_at_risk():
    job = {"state": "running", "last_step": 12, "lease_epoch": 1, "last_checkpoint": None}
    cost = interruption_cost(job, [sample(0, 30, 30.0)], NONE)
    assert (cost["steps"], cost["gpu_seconds"], cost["checkpoint_step"]) == (12, 30.0, None)


def test_a_run_that_resumed_from_its_checkpoint_has_lost_nothing_yet():
    # Started sets last_step to the step it resumed from: no step since, only the restart's time.
    job = {**RUNNING, "last_step": 100, "last_checkpoint": {"step": 100, "at": at(-500).isoformat()}}
    cost = interruption_cost(job, [sample(0, 5, 5.0)], NONE)
    assert (cost["steps"], cost["gpu_seconds"]) == (0, 5.0)


@pytest.mark.parametrize("state", ["queued", "backoff", "succeeded", "failed", "cancelled"])
def test_no_interruption_cost_outside_a_run_or_an_interruption(state):
    assert interruption_cost({**RUNNING, "state": state}, [sample(0, 30, 60.0)], NONE) is None


def test_a_gang_forming_has_its_workers_time_at_risk():
    cost = interruption_cost({**RUNNING, "state": "admitting", "last_step": None}, [sample(50, 60, 20.0)], NONE)
    assert cost["kind"] == "at_risk" and cost["steps"] == 0 and cost["gpu_seconds"] == 20.0


def test_the_single_job_view_carries_the_cost_and_the_live_budget_and_lists_do_not_carry_the_cost():
    job = {"id": "j", "spec": {}, **RUNNING}
    b = {**budget(), "remaining_seconds": 940.0, "overshoot_seconds": 0.0, "ceiling_history": []}
    one = job_view(job, budget=b, usage=[sample(30, 60, 60.0)])
    assert one["budget"]["provisional_seconds"] == 24.0 and one["budget"]["consumed_live_seconds"] == 84.0
    assert one["interruption_cost"]["gpu_seconds"] == 30.0 + 24.0
    assert "interruption_cost" not in job_view(job, budget=b)


def test_each_ceiling_entry_says_what_it_replaced():
    hist = [{"ceiling_seconds": 12.0, "actor": "alice"}, {"ceiling_seconds": 140.0, "actor": "ops"},
            {"ceiling_seconds": 400.0, "actor": "ops"}]
    assert [h["previous_ceiling_seconds"] for h in with_previous(hist)] == [None, 12.0, 140.0]
    assert with_previous(None) is None and with_previous([]) == []
