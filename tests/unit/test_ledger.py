"""Budget arithmetic: GPU-seconds, exhaustion once per ceiling, the requeue rule at its boundary, the
checkpoint ETA and the first-checkpoint warning."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.budget.domain.ledger import (
    Account,
    StepStats,
    check_new_ceiling,
    first_checkpoint_warning,
    gang_devices,
    gpu_seconds,
    next_checkpoint_eta,
    on_ceiling,
    on_step,
    on_terminal,
    on_usage,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("devices", "wall", "expected"), [(0, 10, 10), (1, 10, 10), (4, 2.5, 10), (8, 0, 0)],
                         ids=["cpu-only-counts-one", "one-gpu", "four-gpus", "no-time"])
def test_gpu_seconds_are_devices_times_wall_time(devices, wall, expected):
    assert gpu_seconds(devices, wall) == expected


def test_gang_devices_count_every_worker():
    assert gang_devices(3, 0) == 3 and gang_devices(2, 4) == 8


def test_exhaustion_is_announced_once_per_ceiling():
    acc = Account(ceiling=100.0)
    d = on_usage(acc, 99.0)
    assert not d.exhausted
    d = on_usage(d.account, 1.0)  # reaching the ceiling exactly counts
    assert d.exhausted and d.account.exhausted_for == 100.0
    d = on_usage(d.account, 5.0)  # overshoot while the job stops: not announced again
    assert not d.exhausted and d.account.overshoot == 5.0 and d.account.consumed == 105.0
    d = on_ceiling(d.account, 200.0)  # requeued with a new total ceiling
    assert not d.exhausted and d.account.overshoot == 5.0
    d = on_usage(d.account, 95.0)
    assert d.exhausted and d.account.exhausted_for == 200.0 and d.account.consumed == 200.0


def test_a_terminal_job_is_never_announced():
    d = on_usage(on_terminal(Account(ceiling=10.0)), 50.0)
    assert not d.exhausted and d.account.overshoot == 40.0


def test_usage_before_the_ceiling_is_known_is_judged_when_it_arrives():
    d = on_usage(Account(ceiling=None), 50.0)
    assert not d.exhausted and d.account.consumed == 50.0
    assert on_ceiling(d.account, 40.0).exhausted


@given(st.lists(st.floats(min_value=0, max_value=1e4), max_size=30), st.floats(min_value=1, max_value=1e5))
def test_consumption_only_grows_and_is_announced_at_most_once(samples, ceiling):
    acc, announced, previous = Account(ceiling=ceiling), 0, 0.0
    for s in samples:
        d = on_usage(acc, s)
        acc, announced = d.account, announced + d.exhausted
        assert acc.consumed >= previous
        previous = acc.consumed
    assert announced == (1 if acc.consumed >= ceiling else 0)


@pytest.mark.parametrize(("consumed", "new", "ok"), [
    (100.0, 159.99, False), (100.0, 160.0, True), (100.0, 500.0, True), (0.0, 59.99, False), (0.0, 60.0, True),
], ids=["plus-59.99-refused", "plus-60-accepted", "well-above", "fresh-59.99", "fresh-60"])
def test_requeue_ceiling_must_leave_a_minute(consumed, new, ok):
    check = check_new_ceiling(consumed, new)
    assert check.ok is ok
    if not ok:
        assert check.detail() == {"consumed_seconds": consumed, "minimum_seconds": consumed + 60,
                                  "given_seconds": new}
        assert f"{consumed + 60:g}" in check.reason
    else:
        assert check.reason is None


def test_step_time_is_a_mean_weighted_by_steps():
    stats = on_step(StepStats(), 10, 1.0)  # first report: counts as one step
    stats = on_step(stats, 20, 2.0)  # ten steps at 2 s
    assert stats.last_step == 20 and stats.measured_steps == 11
    assert stats.mean_step_seconds == pytest.approx((1.0 + 20.0) / 11)
    assert on_step(stats, 5, 3.0).measured_steps == 12  # resumed from an earlier step
    assert on_step(StepStats(), 3, None) == StepStats(last_step=3)


@pytest.mark.parametrize(("step", "every", "mean", "eta"), [
    (0, 50, 2.0, 100.0), (49, 50, 2.0, 2.0), (50, 50, 2.0, 100.0), (120, 50, 0.5, 15.0), (10, 50, None, None),
], ids=["start", "one-step-left", "just-checkpointed", "third-interval", "unmeasured"])
def test_checkpoint_eta(step, every, mean, eta):
    assert next_checkpoint_eta(step, every, mean) == eta


def test_first_checkpoint_warning_carries_both_numbers():
    w = first_checkpoint_warning(every_steps=100, step_seconds=2.0, devices=4, ceiling=700.0, source="estimate")
    assert w is not None and w.expected_seconds == 800.0 and w.ceiling_seconds == 700.0
    assert "800" in w.reason and "700" in w.reason and w.as_dict()["source"] == "estimate"
    assert first_checkpoint_warning(100, 1.75, 4, 700.0, "measured") is None  # exactly fits
    assert first_checkpoint_warning(100, None, 4, 700.0, "measured") is None  # nothing measured yet
    assert first_checkpoint_warning(100, 20.0, 0, 1000.0, "measured").devices == 1  # CPU-only


@pytest.mark.parametrize(("state", "previous", "starts"), [
    ("running", "queued", True), ("running", "admitting", True), ("running", None, True),
    ("running", "running", False), ("admitting", "queued", False), ("interrupted", "running", False),
], ids=lambda v: str(v))
def test_a_run_starts_when_its_job_moves_into_running(state, previous, starts):
    from services.budget.domain.ledger import starts_run

    assert starts_run(state, previous) is starts
