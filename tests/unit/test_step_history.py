"""A job's step history for the loss curve and step-time plot: bounded, runs never mixed in one point
(services/gateway/domain/steps.py)."""

from __future__ import annotations

import math

import pytest

from services.gateway.domain.steps import downsample, steps_view

pytestmark = pytest.mark.unit


def rows(epoch: int, steps: range, loss=lambda s: 1.0 / s) -> list[dict]:
    return [{"epoch": epoch, "step": s, "loss": loss(s), "step_seconds": 0.5, "metrics": {"lr": s}, "time": f"t{s}"}
            for s in steps]


def test_few_reports_are_shown_as_they_are():
    got = steps_view("j1", rows(1, range(1, 6)), 500)
    assert got["reports"] == 5 and not got["downsampled"]
    assert [p["step"] for p in got["points"]] == [1, 2, 3, 4, 5] and got["points"][1]["loss"] == 0.5
    assert got["points"][0] == {"epoch": 1, "step": 1, "time": "t1", "loss": 1.0, "step_seconds": 0.5,
                                "metrics": {"lr": 1}, "reports": 1}


@pytest.mark.parametrize(("n", "max_points"), [(10_000, 500), (1001, 1000), (7, 3), (2000, 1), (500, 2)])
def test_many_reports_never_exceed_max_points_and_keep_the_last_step(n, max_points):
    points = downsample(rows(1, range(1, n + 1)), max_points)
    assert 1 <= len(points) <= max_points and points[-1]["step"] == n
    assert sum(p["reports"] for p in points) == n  # every report is in exactly one point
    assert [p["step"] for p in points] == sorted(p["step"] for p in points)


def test_a_point_is_the_mean_of_its_bucket_and_ignores_what_is_not_finite():
    data = rows(1, range(1, 5), loss=lambda s: [2.0, 4.0, math.nan, None][s - 1])
    (point,) = downsample(data, 1)
    assert point["loss"] == 3.0 and point["step"] == 4 and point["reports"] == 4 and point["step_seconds"] == 0.5
    (empty,) = downsample(rows(1, range(1, 3), loss=lambda s: None), 1)
    assert empty["loss"] is None


def test_a_resumed_run_repeats_steps_but_no_point_mixes_two_runs():
    # Run 1 reached step 150, run 2 resumed from the checkpoint at 100.
    data = rows(1, range(1, 151)) + rows(2, range(101, 301))
    points = downsample(data, 20)
    assert len(points) <= 20 and {p["epoch"] for p in points} == {1, 2}
    assert [p for p in points if p["epoch"] == 1][-1]["step"] == 150  # the first run's last point survives
    assert points[-1] == {**points[-1], "epoch": 2, "step": 300}
    assert sum(p["reports"] for p in points) == len(data)


def test_no_reports_no_points():
    assert steps_view("j1", [], 10) == {"job_id": "j1", "reports": 0, "downsampled": False, "points": []}


def test_more_runs_than_points_keeps_the_latest_runs():
    data = [r for epoch in range(1, 6) for r in rows(epoch, range(1, 3))]
    points = downsample(data, 3)
    assert [p["epoch"] for p in points] == [3, 4, 5]
