"""bench_checkpoint still runs and returns what ``teto bench`` reads (no timing is asserted)."""

from __future__ import annotations

import os

import pytest

from bench import bench_checkpoint

pytestmark = pytest.mark.unit


def test_the_checkpoint_bench_returns_the_runner_s_fields(tmp_path, monkeypatch):
    monkeypatch.delenv("TETO_CHECKPOINT_DIR", raising=False)
    r = bench_checkpoint.main(quick=True, mb=4, rounds=2, directory=str(tmp_path))
    assert set(r) == {"name", "figure", "reference", "ratio", "target", "unit", "passed", "note"}
    assert r["name"] == "checkpoint" and r["target"] == 0.05 and isinstance(r["passed"], bool)
    assert r["figure"] > 0 and r["reference"] > 0 and list(tmp_path.iterdir()) == []
    assert "TETO_CHECKPOINT_DIR" not in os.environ  # the bench leaves the caller's environment as it was


def test_the_overlap_probe_times_a_real_step_three_ways():
    """The probe behind "the snapshot is not overlapped with the next step" runs a real step (one layer here):
    each stall is a step's time less the plain step's, and the state it copies is the weights and AdamW's two
    moments (three tensors per parameter: 3 x 4 x (1024 x 1024 + 1024) bytes)."""
    p = bench_checkpoint.overlap_probe(layers=1, rounds=2)
    assert p["mb"] == pytest.approx(3 * 4 * (1024 * 1024 + 1024) / 1e6)
    assert p["step_ms"] > 0
    assert set(p) == {"mb", "step_ms", "synchronous_stall_ms", "overlapped_stall_ms"}
