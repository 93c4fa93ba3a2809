"""The signal evaluator's pure part (services/health/evaluator.py): stored rows in, the signals to write and the
events to emit out, every verdict domain/signals.py's. The store's reads and the conditional writes are tested
on PostgreSQL (tests/integration/test_health_due_executors.py, test_health_evaluate_batch.py)."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta

import pytest

from libs.contracts.jobs import JobState
from libs.contracts.nodes import Signal
from libs.contracts.telemetry import Phase
from services.health.domain.signals import Thresholds, due_bounds, executor_signal, job_signal
from services.health.evaluator import (executor_changes, job_changes, job_writes, phase_of, reading_of,
                                       signal_changed, signal_of, state_of, thresholds_of)
from tests.support.builders import EX, JOB, executor_reading, job_reading

pytestmark = pytest.mark.unit
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
TH = Thresholds(signal_timeout_seconds=60.0, stuck_after_seconds=120.0)
STORED = [None, "ok", "no_signal", "stuck"]


def ago(seconds: float | None) -> datetime | None:
    return None if seconds is None else NOW - timedelta(seconds=seconds)


# -- stored values ----------------------------------------------------------------------------------------------

def test_stored_values_this_version_does_not_know_read_as_none():
    assert phase_of("training") is Phase.TRAINING and phase_of("warp-drive") is None and phase_of(None) is None
    assert state_of("running") is JobState.RUNNING and state_of("limbo") is None and state_of(None) is None
    assert signal_of("stuck") is Signal.STUCK and signal_of(None) is None and signal_of("") is None


def test_the_thresholds_kept_with_a_signal_are_those_it_was_judged_with():
    reading = job_signal(JobState.RUNNING, ago(5), ago(5), Phase.TRAINING, NOW, TH, progress_interval_seconds=90)
    assert json.loads(thresholds_of(reading)) == {"no_signal_after_seconds": 60.0, "stuck_after_seconds": 180.0}


# -- one row's reading ------------------------------------------------------------------------------------------

def test_a_step_never_reported_has_no_progress_signal_however_old_its_change_time():
    never_stepped, stepped = (executor_reading(step=step, still=1000, now=NOW) for step in (None, 3))
    assert reading_of(never_stepped, "last_heartbeat", None, NOW, TH).signal is Signal.OK
    assert reading_of(stepped, "last_heartbeat", None, NOW, TH).signal is Signal.STUCK


@pytest.mark.parametrize(("heard", "still", "phase"), list(itertools.product(
    [None, 5.0, 59.999, 60.001, 500.0], [None, 5.0, 119.999, 120.001, 500.0], ["training", "idle", None])))
def test_a_rows_reading_is_the_pure_rules_on_its_columns(heard, still, phase):
    row = executor_reading(heard=heard, still=still, phase=phase, now=NOW)
    expected = executor_signal(None, ago(heard), ago(still), phase_of(phase), NOW, TH)
    assert reading_of(row, "last_heartbeat", None, NOW, TH, judge=executor_signal) == expected


# -- what a pass writes -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("stored", STORED, ids=str)
@pytest.mark.parametrize("heard", [5.0, 500.0, None], ids=["heard", "silent", "never"])
@pytest.mark.parametrize("still", [5.0, 500.0], ids=["moving", "standing"])
def test_an_executor_is_written_only_when_its_verdict_differs_from_its_stored_signal(stored, heard, still):
    row = executor_reading(signal=stored, heard=heard, still=still, now=NOW)
    verdict = executor_signal(None, ago(heard), ago(still), Phase.TRAINING, NOW, TH)
    writes = executor_changes([row], NOW, TH)
    if str(verdict.signal) == stored:
        assert writes == []
    else:
        # The inputs it was judged on go with it: the store writes it only if they are still those in the table.
        assert writes == [(EX, str(verdict.signal), verdict.since or NOW, thresholds_of(verdict),
                           row["last_heartbeat"], row["step_changed_at"])]


@pytest.mark.parametrize("stored", STORED, ids=str)
@pytest.mark.parametrize("state", [None, *JobState], ids=str)
@pytest.mark.parametrize("heard", [5.0, 500.0], ids=["heard", "silent"])
def test_a_job_is_written_only_when_its_verdict_differs_and_loses_its_signal_once_not_running(stored, state, heard):
    row = job_reading(signal=stored, state=state and str(state), heard=heard, now=NOW)
    verdict = job_signal(state, ago(heard), ago(5.0), Phase.TRAINING, NOW, TH)
    changes = job_changes([row], NOW, TH)
    if (verdict.signal and str(verdict.signal)) == stored:
        assert changes == []
        return
    assert changes == [(row, verdict, verdict.since or NOW)]
    if state is not None and state is not JobState.RUNNING:
        assert verdict.signal is None  # a signal applies only while an executor runs the job
    (write,) = job_writes(changes)
    assert write == (JOB, verdict.signal and str(verdict.signal), verdict.since or NOW, thresholds_of(verdict),
                     row["last_contact_at"], row["step_changed_at"], row["state"])


def test_a_pass_keeps_the_rows_order_the_lock_order():
    rows = [executor_reading(executor_id=f"ex{i}", now=NOW) for i in (1, 2, 3)]
    assert [w[0] for w in executor_changes(rows, NOW, TH)] == ["ex1", "ex2", "ex3"]


def test_a_jobs_event_says_what_changed_and_the_numbers_behind_it():
    row = job_reading(signal="ok", heard=90.0, now=NOW)
    ((_, reading, since),) = job_changes([row], NOW, TH)
    ev = signal_changed(row, reading, since)
    assert (ev.job_id, ev.executor_id, ev.signal, ev.previous) == (JOB, EX, Signal.NO_SIGNAL, Signal.OK)
    assert ev.since == NOW - timedelta(seconds=30)  # silent since the timeout passed, not since the pass
    assert ev.seconds_since_heartbeat == pytest.approx(90.0)
    assert (ev.no_signal_after_seconds, ev.stuck_after_seconds) == (60.0, 120.0)


# -- the due queries' bounds ------------------------------------------------------------------------------------

def test_the_due_bounds_are_each_threshold_taken_one_millisecond_the_lenient_way():
    ms, timeout, still = timedelta(milliseconds=1), timedelta(seconds=60), timedelta(seconds=120)
    assert due_bounds(NOW, TH) == (NOW - timeout - ms, NOW - timeout + ms, NOW - still + ms, NOW + ms,
                                   NOW - still - ms, NOW - ms)
