"""The overshoot benchmark still works (a smoke at its quick size; never a timing assertion)."""

from __future__ import annotations

import pytest

from bench import bench_overshoot

pytestmark = pytest.mark.integration


def test_the_overshoot_bench_reports_before_and_after_in_the_common_shape():
    result = bench_overshoot.main(quick=True)
    assert set(result) == {"name", "figure", "reference", "ratio", "target", "unit", "passed", "note"}
    assert result["name"] == "overshoot" and result["unit"] == "GPU-s"
    assert result["figure"] is not None and result["reference"] is not None
    assert isinstance(result["passed"], bool)
