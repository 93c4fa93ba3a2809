"""bench_tenancy still runs and returns what ``teto bench`` reads (no timing is asserted)."""

from __future__ import annotations

import pytest

from bench import bench_tenancy

pytestmark = pytest.mark.unit


def test_the_tenancy_bench_admits_every_job_and_returns_the_runner_s_fields():
    sim = bench_tenancy.simulate(orgs_n=6, jobs_per_org=20, executors=30)
    assert sim["admitted"] == 120 and sim["passes"] >= 4 and sim["reasons"] > 0
    row = bench_tenancy.main(quick=True)
    assert set(row) == {"name", "figure", "reference", "ratio", "target", "unit", "passed", "note"}
    assert row["name"] == "tenancy_admission" and row["reference"] == pytest.approx(35.1)
