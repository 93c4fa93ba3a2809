"""Signals are pure functions of (state, last heartbeat, last step change, phase, now): the rules of DESIGN
section 6, checked over the whole state space and with generated timings."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libs.contracts.jobs import TERMINAL_STATES, JobState
from libs.contracts.nodes import Signal
from libs.contracts.telemetry import Phase
from services.health.domain.signals import Thresholds, executor_signal, job_signal

pytestmark = pytest.mark.unit

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TH = Thresholds(signal_timeout_seconds=60.0, stuck_after_seconds=120.0)


def ago(seconds: float) -> datetime:
    return T0 - timedelta(seconds=seconds)


def maybe_ago(seconds: float | None) -> datetime | None:
    return None if seconds is None else ago(seconds)


def read(state, hb_age, step_age, phase=Phase.TRAINING, progress=None):
    return job_signal(state, None if hb_age is None else ago(hb_age), None if step_age is None else ago(step_age),
                      phase, T0, TH, progress_interval_seconds=progress)


@pytest.mark.parametrize("state", list(JobState), ids=str)
def test_silence_is_no_signal_only_where_a_signal_applies(state):
    expected = Signal.NO_SIGNAL if state == JobState.RUNNING else None
    assert read(state, hb_age=61, step_age=61).signal == expected


@pytest.mark.parametrize("state", [s for s in JobState if s != JobState.RUNNING], ids=str)
@pytest.mark.parametrize("phase", list(Phase), ids=str)
def test_no_signal_applies_to_jobs_without_their_own_executor(state, phase):
    reading = read(state, hb_age=10_000, step_age=10_000, phase=phase)
    assert reading.signal is None and reading.since is None


@pytest.mark.parametrize(
    ("hb_age", "step_age", "phase", "expected"),
    [
        (0, 0, Phase.TRAINING, Signal.OK),
        (60, 0, Phase.TRAINING, Signal.OK),  # exactly at the timeout: not yet longer than it
        (60.01, 0, Phase.TRAINING, Signal.NO_SIGNAL),
        (None, None, Phase.TRAINING, Signal.NO_SIGNAL),  # never heard from
        (1, 120, Phase.TRAINING, Signal.OK),
        (1, 120.01, Phase.TRAINING, Signal.STUCK),
        (1, 10_000, Phase.CHECKPOINTING, Signal.OK),  # a checkpoint is a pause, not a hang
        (1, 10_000, Phase.STARTING, Signal.OK),
        (1, 10_000, Phase.IDLE, Signal.OK),
        (1, None, Phase.TRAINING, Signal.OK),  # a workload that never reports steps has no progress signal
        (61, 10_000, Phase.TRAINING, Signal.NO_SIGNAL),  # silence wins over stuck: the step is unknown
    ],
    ids=["fresh", "at-timeout", "past-timeout", "never-heard", "at-stuck", "past-stuck", "checkpointing",
         "starting", "idle", "no-steps-reported", "silent-and-stale"],
)
def test_running_job_rules(hb_age, step_age, phase, expected):
    assert read(JobState.RUNNING, hb_age, step_age, phase).signal == expected


def test_stuck_threshold_is_at_least_two_progress_intervals():
    assert read(JobState.RUNNING, 1, 150, progress=100).signal == Signal.OK
    reading = read(JobState.RUNNING, 1, 201, progress=100)
    assert reading.signal == Signal.STUCK and reading.stuck_after == 200


def test_reading_carries_the_numbers_and_when_it_became_true():
    reading = read(JobState.RUNNING, hb_age=90, step_age=100)
    assert reading.since == ago(90) + timedelta(seconds=60)
    assert reading.detail() == {"seconds_since_heartbeat": 90.0, "seconds_since_step_change": 100.0,
                                "no_signal_after_seconds": 60.0, "stuck_after_seconds": 120.0}
    stuck = read(JobState.RUNNING, hb_age=1, step_age=130)
    assert stuck.since == ago(130) + timedelta(seconds=120)


def test_executor_without_a_running_job_is_judged_alone():
    for state in (None, JobState.QUEUED, JobState.SUCCEEDED):
        assert executor_signal(state, ago(61), ago(0), Phase.IDLE, T0, TH).signal == Signal.NO_SIGNAL


ages = st.one_of(st.none(), st.floats(min_value=0, max_value=1e6, allow_nan=False))
phases = st.one_of(st.none(), st.sampled_from(list(Phase)))
progress = st.one_of(st.none(), st.floats(min_value=0.01, max_value=1e4, allow_nan=False))
thresholds = st.builds(Thresholds, st.floats(min_value=0.1, max_value=1e4), st.floats(min_value=0.1, max_value=1e4))


@given(st.sampled_from([JobState.QUEUED, JobState.ADMITTING]), ages, ages, phases, progress, thresholds)
def test_queued_and_admitting_are_never_stuck(state, hb, step, phase, prog, th):
    r = job_signal(state, maybe_ago(hb), maybe_ago(step), phase, T0, th, progress_interval_seconds=prog)
    assert r.signal is None


@given(st.sampled_from(sorted(TERMINAL_STATES)), ages, ages, phases, progress, thresholds)
def test_terminal_jobs_carry_no_signal_whatever_their_last_heartbeat(state, hb, step, phase, prog, th):
    r = job_signal(state, maybe_ago(hb), maybe_ago(step), phase, T0, th, progress_interval_seconds=prog)
    assert r.signal is None


fractions = st.floats(min_value=0, max_value=0.999)  # strictly shorter, with room for microsecond rounding


@given(fractions, fractions, progress, thresholds)
def test_a_pause_shorter_than_the_threshold_is_not_stuck(fraction, hb_fraction, prog, th):
    pause = th.stuck_threshold(prog) * fraction
    hb = th.signal_timeout_seconds * hb_fraction  # heartbeats fresh
    r = job_signal(JobState.RUNNING, ago(hb), ago(pause), Phase.TRAINING, T0, th, progress_interval_seconds=prog)
    assert r.signal == Signal.OK


@given(st.one_of(st.none(), st.sampled_from(list(JobState))), ages, ages, phases, progress, thresholds)
def test_job_signal_equals_the_signal_of_the_executor_running_it(state, hb, step, phase, prog, th):
    args = (maybe_ago(hb), maybe_ago(step), phase, T0, th)
    job = job_signal(state, *args, progress_interval_seconds=prog)
    ex = executor_signal(state, *args, progress_interval_seconds=prog)
    if state in (None, JobState.RUNNING):  # an executor runs the job exactly in these states
        assert job == ex
    else:
        assert job.signal is None and ex.signal is not None


def test_settings_default_timeout_is_two_heartbeats_and_a_shorter_one_is_refused():
    from libs.runtime.settings import SettingsError
    from services.health.settings import HealthSettings

    settings = HealthSettings.from_env(env={}, heartbeat_seconds=10, lease_seconds=60)
    assert settings.thresholds == Thresholds(signal_timeout_seconds=20.0, stuck_after_seconds=120.0)
    with pytest.raises(SettingsError, match="shorter than one heartbeat"):
        HealthSettings.from_env(env={}, heartbeat_seconds=10, lease_seconds=60, signal_timeout_seconds=5)


@given(ages, ages, phases, progress, thresholds)
def test_an_executors_verdict_is_the_same_whatever_its_jobs_state(hb, step, phase, prog, th):
    # The evaluator judges executors without reading their jobs (services/health/evaluator.py): every job
    # state, and none at all, must give the same reading.
    args = (maybe_ago(hb), maybe_ago(step), phase, T0, th)
    readings = {executor_signal(state, *args, progress_interval_seconds=prog) for state in [None, *JobState]}
    assert len(readings) == 1
