"""The training-stack callbacks' decisions (teto/integrations/policy.py): pure, no library, no clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from teto.integrations import policy
from teto.integrations.policy import Pace

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("value", "expected"), [
    (None, 1.0), ("", 1.0), ("abc", 1.0), ("0", 1.0), ("-2", 1.0), ("nan", 1.0), ("inf", 1.0), ("2.5", 2.5),
    ("0.1", 0.1)], ids=str)
def test_the_progress_interval_comes_from_the_run_environment_and_a_bad_value_reads_as_one_second(value, expected):
    env = {} if value is None else {policy.PROGRESS_ENV: value}
    assert policy.progress_interval(env) == expected


def test_the_first_step_is_always_reported():
    assert policy.report_due(Pace(), 100.0, 5.0, step=1, max_steps=10)


@pytest.mark.parametrize(("elapsed", "due"), [(0.0, False), (4.99, False), (5.0, True), (7.0, True)], ids=str)
def test_a_step_is_reported_once_the_interval_has_passed_never_more_often(elapsed, due):
    pace = Pace(reported_at=100.0)
    assert policy.report_due(pace, 100.0 + elapsed, 5.0, step=3, max_steps=10) is due


@pytest.mark.parametrize("max_steps", [None, 0, -1], ids=str)
def test_without_a_known_last_step_only_the_interval_counts(max_steps):
    assert not policy.report_due(Pace(reported_at=1.0), 1.1, 5.0, step=10**6, max_steps=max_steps)


def test_the_last_step_is_reported_within_the_interval():
    pace = Pace(reported_at=100.0)
    assert policy.report_due(pace, 100.1, 5.0, step=10, max_steps=10)
    assert not policy.report_due(pace, 100.1, 5.0, step=9, max_steps=10)


def test_the_step_a_stop_ends_the_run_at_is_reported_within_the_interval():
    # Its checkpoint is reported next: the job's step must not lag behind the checkpoint it holds.
    assert policy.report_due(Pace(reported_at=100.0), 100.1, 5.0, step=9, max_steps=None, final=True)


@pytest.mark.parametrize(("step", "every", "saved", "due"), [
    (10, 5, set(), True), (10, 5, {10}, False), (11, 5, set(), False), (0, 5, set(), False), (10, None, set(), False),
    (10, 0, set(), False), (3, 1, {1, 2}, True)], ids=str)
def test_the_jobs_cadence_asks_for_a_checkpoint_every_n_steps_once(step, every, saved, due):
    assert policy.cadence_due(step, every, saved=saved) is due


def test_a_report_carries_the_mean_step_time_since_the_last_and_starts_afresh():
    pace = Pace()
    for seconds in (0.1, 0.3, None, -1.0):  # untimed and negative steps are not timed
        policy.note_step(pace, seconds)
    policy.note_logs(pace, {"loss": 2.0, "learning_rate": 1e-3, "grad_norm": 0.5, "epoch": 0.25})
    r = policy.take_report(pace, 7.0, step=4, max_steps=100)
    assert r == policy.StepReport(step=4, total_steps=100, loss=2.0, step_seconds=pytest.approx(0.2),
                                  metrics={"grad_norm": 0.5, "epoch": 0.25, "learning_rate": 1e-3})
    assert (pace.reported_at, pace.seconds_n, pace.seconds_sum, pace.loss, pace.metrics) == (7.0, 0, 0.0, None, {})


def test_a_loss_is_reported_once_so_the_curve_never_repeats_a_point_but_the_learning_rate_stays():
    pace = Pace()
    policy.note_logs(pace, {"loss": 3.0, "learning_rate": 0.1})
    assert policy.take_report(pace, 1.0, step=1, max_steps=None).loss == 3.0
    again = policy.take_report(pace, 2.0, step=2, max_steps=None)
    assert again.loss is None and again.metrics == {"learning_rate": 0.1} and again.total_steps is None
    assert again.step_seconds is None  # no step timed since


@pytest.mark.parametrize(("logs", "loss", "lr"), [
    ({"loss": 1.5}, 1.5, None), ({"train_loss": 1.5, "lr": 0.2}, 1.5, 0.2),
    ({"train/loss": 2, "lr-AdamW": 1}, 2.0, 1.0),
    ({"loss": float("nan")}, None, None), ({"loss": "x"}, None, None), ({"loss": True}, None, None),
    ({"eval_loss": 0.5}, None, None), ({}, None, None)], ids=str)
def test_what_a_log_gives_the_report(logs, loss, lr):
    pace = Pace()
    assert policy.note_logs(pace, logs) is (loss is not None)
    assert (pace.loss, pace.learning_rate) == (loss, lr)
    if "eval_loss" in logs:
        assert pace.metrics == {"eval_loss": 0.5}  # another number, kept as a metric


@pytest.mark.parametrize("requested", [False, True], ids=["no stop", "stop"])
@pytest.mark.parametrize("checkpoint_first", [False, True], ids=["no checkpoint asked", "checkpoint asked"])
@pytest.mark.parametrize("saved", [False, True], ids=["not saving", "saving this step"])
def test_a_stop_ends_training_on_a_fresh_checkpoint_when_it_asks_for_one(requested, checkpoint_first, saved):
    d = policy.on_stop(requested, checkpoint_first=checkpoint_first, saved_this_step=saved)
    assert d.stop is requested
    # A save only for a stop that asks for one, and never a second save of the step being saved anyway.
    assert d.save is (requested and checkpoint_first and not saved)


@pytest.mark.parametrize(("writer", "reported", "due"), [
    (True, set(), True), (True, {5}, False), (True, {4, 6}, True), (False, set(), False), (False, {5}, False)],
    ids=str)
def test_a_checkpoint_is_reported_by_rank_zero_once_per_step(writer, reported, due):
    assert policy.report_checkpoint_due(5, is_writer=writer, reported=reported) is due


def test_under_teto_rank_zero_writes_in_the_jobs_checkpoint_directory_another_rank_in_its_own_work():
    kw = {"checkpoint_dir": Path("/ck/job"), "work_dir": Path("/work/job"), "user_dir": "out"}
    assert policy.checkpoint_root(in_teto=True, rank=0, **kw) == Path("/ck/job")
    assert policy.checkpoint_root(in_teto=True, rank=1, **kw) == Path("/work/job/rank-1-checkpoints")
    assert policy.checkpoint_root(in_teto=True, rank=2, **{**kw, "work_dir": None}) == Path("out/rank-2-checkpoints")
    assert policy.checkpoint_root(in_teto=False, rank=0, **kw) is None  # outside Teto: the script's choice


def test_the_resume_path_is_the_chosen_checkpoint_or_none():
    assert policy.resume_path(None) is None
    assert policy.resume_path((120, Path("/ck/job/checkpoint-120"))) == "/ck/job/checkpoint-120"


@pytest.mark.parametrize(("flags", "stop"), [([], False), ([False], False), ([False, False], False),
                                             ([True, False], True), ([False, True], True), ([True, True], True)],
                         ids=str)
def test_a_gang_stops_together_when_any_worker_was_asked(flags, stop):
    assert policy.stop_agreed(flags) is stop


@pytest.mark.parametrize(("before", "after", "gone"), [
    ([3], [6], False), ([3, 4], [6, 7], False), ([3], [3], True), ([3, 4], [6, 4], True), ([0], [0], True),
    ([], [], False), ([1], [], True)], ids=str)
def test_a_peer_whose_alive_count_stopped_is_gone(before, after, gone):
    assert policy.beats_stopped(before, after) is gone
