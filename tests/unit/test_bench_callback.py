"""bench/bench_callback.py's figure: per round, median step with the callback over median step without."""

from __future__ import annotations

import pytest

from bench.bench_callback import ratios
from teto import benchrun

pytestmark = pytest.mark.unit


def test_each_round_compares_the_median_steps_of_its_two_runs():
    assert ratios([([1.0, 1.1, 5.0], [1.0, 1.0, 0.9]), ([2.0, 2.0], [1.0, 3.0])]) == pytest.approx([1.1, 1.0])


def test_the_benchmark_is_discovered():
    assert "callback" in benchrun.discover(benchrun.bench_dir())
