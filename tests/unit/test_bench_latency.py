"""The benchmarks' latency arithmetic (bench/_latency.py) and the agent-overhead bench's step-time rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import bench_agent_overhead as overhead
from bench._latency import percentile, spread, summary

pytestmark = pytest.mark.unit


def test_percentile_interpolates_between_closest_ranks_like_numpy():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 5.0
    assert percentile(values, 50) == 3.0
    assert percentile(values, 25) == 2.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert percentile([7.0], 99) == 7.0


def test_percentile_refuses_nothing_and_a_rank_out_of_range():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)
    with pytest.raises(ValueError):
        percentile([1.0], -1)


@given(st.lists(st.floats(min_value=0, max_value=1e6), min_size=1, max_size=50),
       st.floats(min_value=0, max_value=100), st.floats(min_value=0, max_value=100))
def test_percentile_is_monotone_and_within_the_values(values, q1, q2):
    lo, hi = sorted((q1, q2))
    assert min(values) <= percentile(values, lo) <= percentile(values, hi) <= max(values)


def test_summary_is_in_milliseconds_and_the_rate_counts_requests_over_the_wall_time():
    s = summary([0.001] * 98 + [0.010, 0.050], seconds=2.0)
    assert s["p50_ms"] == pytest.approx(1.0) and s["max_ms"] == pytest.approx(50.0)
    assert s["p99_ms"] == pytest.approx(10.0 + 0.01 * 40.0)
    assert s["rate"] == 50.0 and s["n"] == 100
    with pytest.raises(ValueError):
        summary([0.1], seconds=0)


def test_spread_is_median_min_max():
    assert spread([3.0, -1.0, 2.0, 10.0]) == (2.5, -1.0, 10.0)


def test_a_run_s_step_time_is_the_median_after_the_warm_up():
    warm = [1.0] * overhead.WARMUP_STEPS  # slow first steps (allocations) are left out
    assert overhead.step_time(warm + [0.010, 0.012, 0.011] * 20) == 0.011
    assert overhead.step_time([0.5, 0.1, 0.2]) == 0.2  # too short to drop a warm-up: all of it


def test_overhead_is_the_relative_slowdown_in_percent():
    assert overhead.overhead_percent(0.0101, 0.0100) == pytest.approx(1.0)
    assert overhead.overhead_percent(0.0099, 0.0100) == pytest.approx(-1.0)


def test_a_run_s_file_gives_its_step_time_its_mean_report_step_time_and_run_queue_wait(tmp_path):
    out = tmp_path / "run.json"
    out.write_text('{"steps": [0.02, 0.01, 0.03], "report": [0.00002, 0.00001, 0.00003], "cpu": [0.015, 0.01, 0.02], '
                   '"wait": [0.001, 0.0, 0.002], "report_cpu": [0.00001, 0.00001, 0.00004]}')
    assert overhead.read_run(out, 0.5) == overhead.Arm(
        0.02, pytest.approx(0.00002), 0.015, pytest.approx(0.001), pytest.approx(0.005), pytest.approx(0.00002), 0.5)
    out.write_text('{"steps": [0.02], "report": [0.00002], "cpu": [0.02]}')  # a script that does not say them
    assert (overhead.read_run(out).wait, overhead.read_run(out).report_cpu) == (0.0, 0.0)


def test_the_accounted_overhead_is_the_extra_time_off_the_cpu_and_report_step_cpu_over_the_step_without():
    without = overhead.Arm(step=0.010, report=0.000020, cpu=0.010, wait=0.000100, off_cpu=0.000150, report_cpu=15e-6)
    with_agent = overhead.Arm(step=0.013, report=0.000030, cpu=0.012, wait=0.000190, off_cpu=0.000230,
                              report_cpu=35e-6, agent_cpu=0.0002)
    # (80 us + 20 us) of a 10 ms step; the step times and model CPU times (the machine's noise) play no part
    assert overhead.accounted_percent(with_agent, without) == pytest.approx(1.0)


def test_the_overhead_has_a_verdict_only_when_its_interval_is_on_one_side_of_the_target():
    assert overhead.verdict(0.1, 0.9) is True
    assert overhead.verdict(1.2, 2.0) is False
    assert overhead.verdict(0.5, 1.5) is None  # 1 % lies inside: not resolved
    assert overhead.verdict(-87.4, 89.5) is None


def test_the_rows_give_each_figure_with_the_interval_of_its_median():
    rounds = [(overhead.Arm(0.0101 + i * 1e-5, 25e-6, 0.01, 1e-5, 10e-6, 21e-6), overhead.Arm(0.0100, 20e-6, 0.01, 0.0,
                                                                                            0.0, 20e-6))
              for i in range(16)]
    acc, wall = overhead.rows(rounds, steps=150, cgroup=True, seconds=60.0, load=1.0)
    assert acc["figure"] == pytest.approx(0.11) and acc["passed"] is True  # 1 us + 10 us of a 10 ms step
    assert wall["figure"] == pytest.approx(1.75) and wall["passed"] is False  # 1.0 % .. 2.5 %: all above 1 %
    assert "[+1.30..+2.20]" in wall["note"]  # the 4th and 13th of 16 ordered rounds
    few = overhead.rows(rounds[:overhead.MIN_ROUNDS - 1], steps=60, cgroup=True, seconds=9.0, load=1.0)
    assert [r["passed"] for r in few] == [None, None]  # 5 rounds: min..max is only a 94 % interval


@pytest.mark.parametrize(("n", "ranks"), [(5, (1, 5)), (6, (1, 6)), (8, (1, 8)), (9, (2, 8)), (16, (4, 13)),
                                          (100, (40, 61))])
def test_the_median_s_interval_is_the_order_statistics_of_the_binomial_table(n, ranks):
    from bench._latency import median_interval

    assert median_interval([float(i) for i in range(n, 0, -1)]) == (float(ranks[0]), float(ranks[1]))


def test_an_open_loop_schedule_is_evenly_spaced_and_dealt_round_robin():
    from bench.bench_submit import schedule

    due = schedule(rate=10, seconds=1, clients=3)
    assert due == [[0.0, 0.3, 0.6, 0.9], [0.1, 0.4, 0.7], [0.2, 0.5, 0.8]]
    assert sorted(t for d in due for t in d) == [i / 10 for i in range(10)]
    assert schedule(rate=2, seconds=1, clients=4) == [[0.0], [0.5], [], []]
    with pytest.raises(ValueError):
        schedule(rate=0, seconds=1, clients=1)


@pytest.mark.parametrize(("subject", "folded"), [
    ("bx.agent.ex-1.run", "agent.*.run"), ("bx.progress.job1.ex-1", "progress"), ("bx.rpc.lease.renew.ex-1", "rpc.lease"),
    ("_INBOX.abc.def", "_INBOX (replies)"), ("$JS.ACK.AGENT.c.1.2.3", "$JS.ACK (acknowledgements)"),
    ("$JS.API.CONSUMER.MSG.NEXT.x.y", "$JS.API.CONSUMER"), ("bx.usage.ex-1", "usage")])
def test_the_executor_cpu_bench_counts_messages_by_subject_without_their_ids(subject, folded):
    from bench.bench_executor_cpu import kind

    assert kind(subject, "bx") == folded
