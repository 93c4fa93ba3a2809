"""Verdict rules: a node against its group's healthy median or a baseline, and the single re-run."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from libs.contracts.nodes import CheckStatus
from services.health.domain.verdicts import MIN_RATIO, compared, group_median, judge, node_outcome

pytestmark = pytest.mark.unit
C = CheckStatus


def test_a_node_below_three_quarters_of_the_group_median_fails_with_both_numbers():
    peers = [{"copy_gbps": 10.0}, {"copy_gbps": 12.0}, {"copy_gbps": 11.0}]
    v = judge("membw", C.PASSED, {"copy_gbps": 8.0}, peers, attempt=2)
    assert v.status is C.FAILED and not v.rerun
    (c,) = v.comparisons
    assert (c.value, c.reference, c.source) == (8.0, 11.0, "group median of 3")
    assert "8 is below 0.75 x 11" in v.reason


def test_at_three_quarters_it_passes():
    v = judge("membw", C.PASSED, {"copy_gbps": 7.5}, [{"copy_gbps": 10.0}], attempt=1)
    assert v.status is C.PASSED and v.comparisons[0].ratio == 0.75


def test_a_baseline_wins_over_the_group():
    v = judge("matmul", C.PASSED, {"tflops_float32": 5.0}, [{"tflops_float32": 5.0}], attempt=2,
              baselines={"matmul.tflops_float32": 100.0})
    assert v.status is C.FAILED and v.comparisons[0].source == "baseline" and v.comparisons[0].reference == 100.0


def test_with_no_reference_the_figure_is_recorded_and_passes():
    v = judge("membw", C.PASSED, {"copy_gbps": 0.1}, [], attempt=1)
    assert v.status is C.PASSED and v.comparisons[0].source == "none" and v.comparisons[0].reference is None


def test_only_throughput_figures_are_compared():
    assert compared("tflops_bfloat16") and compared("copy_gbps") and compared("busbw_gbps")
    assert not compared("max_rel_error_float32") and not compared("temperature_c") and not compared("seconds")
    v = judge("matmul", C.PASSED, {"max_rel_error_float32": 1.0}, [{"max_rel_error_float32": 0.0}], attempt=1)
    assert v.status is C.PASSED and not v.comparisons


@pytest.mark.parametrize("attempt,rerun", [(1, True), (2, False)], ids=["first run", "re-run"])
@pytest.mark.parametrize("how", ["reported failed", "too slow"])
def test_a_failed_test_is_re_run_once_before_it_counts(attempt, rerun, how):
    if how == "reported failed":
        v = judge("matmul", C.FAILED, {}, [], attempt, error="max relative error 0.5 > 1e-05")
        assert v.reason == "max relative error 0.5 > 1e-05"
    else:
        v = judge("membw", C.PASSED, {"copy_gbps": 1.0}, [{"copy_gbps": 10.0}], attempt)
    assert v.status is C.FAILED and v.rerun is rerun


def test_not_applicable_is_said_and_never_re_run():
    v = judge("nvml", C.NOT_APPLICABLE, {}, [], 1, error="no NVIDIA GPU on this node")
    assert v.status is C.NOT_APPLICABLE and not v.rerun and v.reason == "no NVIDIA GPU on this node"


@pytest.mark.parametrize("statuses,expect", [
    ([C.PASSED, C.NOT_APPLICABLE], C.PASSED),
    ([C.PASSED, C.RUNNING], None),
    ([C.PENDING], None),
    ([C.PASSED, C.FAILED, C.RUNNING], C.FAILED),
    ([], None),
], ids=["all done", "one running", "pending", "one failed", "nothing"])
def test_node_outcome(statuses, expect):
    assert node_outcome(statuses) is expect


@given(st.lists(st.floats(min_value=0.01, max_value=1e6), min_size=1, max_size=20),
       st.floats(min_value=0.01, max_value=1e6))
def test_the_rule_is_exactly_value_below_ratio_times_median(peers, value):
    median, n = group_median([{"x_gbps": p} for p in peers], "x_gbps")
    assert n == len(peers)
    v = judge("membw", C.PASSED, {"x_gbps": value}, [{"x_gbps": p} for p in peers], attempt=2)
    assert (v.status is C.FAILED) == (value / median < MIN_RATIO)


def test_group_median_ignores_missing_and_zero_figures():
    assert group_median([{"a_gbps": 2.0}, {}, {"a_gbps": 0.0}, {"a_gbps": 4.0}], "a_gbps") == (3.0, 2)
