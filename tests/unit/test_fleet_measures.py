"""The fleet bench's arithmetic (bench/bench_fleet.py): a probe heartbeat's signal evaluation lag is measured to
the end of the first evaluator pass that began after health stored it, and a fleet size holds only with
signals judged within 2 s, no false no_signal and every killed executor found."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bench._fleet import Probe, SimExecutor
from bench import _fleet_service, bench_fleet
from bench.bench_fleet import evaluation_lags, holds, percentile

pytestmark = pytest.mark.unit

T = datetime(2026, 12, 1, tzinfo=UTC)


def probe(sent: float, ingested: float | None) -> Probe:
    return Probe("sim00000", T, sent, ingested)


def test_the_lag_ends_with_the_first_pass_that_began_after_the_heartbeat_was_stored():
    passes = [(10.0, 10.5), (11.0, 11.4), (12.0, 12.3)]
    # Stored at 10.2: the pass that began at 10.0 read the table before it; the one at 11.0 judged it.
    assert evaluation_lags([probe(10.1, 10.2)], passes, since=0, until=100) == [pytest.approx(1.3)]
    assert evaluation_lags([probe(9.0, 9.5)], passes, since=0, until=100) == [pytest.approx(1.5)]


def test_probes_outside_the_window_never_stored_or_never_judged_are_left_out():
    passes = [(10.0, 10.5)]
    probes = [probe(1.0, 2.0), probe(5.0, None), probe(10.2, 10.3), probe(6.0, 7.0)]
    assert evaluation_lags(probes, passes, since=4.0, until=20.0) == [pytest.approx(4.5)]


def test_percentile_of_nothing_is_nan_and_of_values_is_an_observed_value():
    assert percentile([], 0.99) != percentile([], 0.99)  # nan
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0 and percentile([3.0, 1.0, 2.0], 0.99) == 3.0


@pytest.mark.parametrize("lag, false, found, held", [(1.9, 0, 100, True), (2.1, 0, 100, False),
                                                      (1.0, 1, 100, False), (1.0, 0, 99, False),
                                                      (float("nan"), 0, 100, False)])
def test_a_size_holds_only_when_every_bar_is_met(lag, false, found, held):
    assert holds({"lag_p99": lag, "false_no_signal": false, "killed": 100, "killed_found": found}) is held


def test_the_batch_log_gives_each_heartbeat_its_stream_time_first_handling_and_commit():
    lines = ["10.000000 10.250000 sim00000:9.500000:9.700000 sim00001:9.600000:9.800000",
             "11.000000 11.100000 sim00000:10.500000:10.600000",
             "12.000000 12.300000 sim00000:9.500000:9.700000"]  # a batch handled again: the first handling counts
    assert bench_fleet.read_batches(lines) == {("sim00000", "9.500000"): (9.7, 10.0, 10.25),
                                                 ("sim00001", "9.600000"): (9.8, 10.0, 10.25),
                                                 ("sim00000", "10.500000"): (10.6, 11.0, 11.1)}
    assert bench_fleet.read_batches([]) == {}


def test_marking_stored_takes_the_commit_from_the_log_and_leaves_unlogged_probes_to_the_poll():
    logged = Probe("sim00000", T, 9.5, ingested=10.4)
    unlogged = Probe("sim00001", T, 9.6, ingested=10.6)
    bench_fleet.mark_stored([logged, unlogged], {("sim00000", f"{T.timestamp():.6f}"): (9.7, 10.0, 10.25)})
    assert (logged.streamed, logged.received, logged.ingested) == (9.7, 10.0, 10.25)
    assert (unlogged.streamed, unlogged.received, unlogged.ingested) == (None, None, 10.6)


def test_the_lag_splits_into_parts_that_add_up_to_it():
    # Due 9.0, sent 9.5, in the stream 9.7, handled 10.0-10.25, the pass that began at 10.0 read before the
    # commit: 11.0-11.4.
    p = Probe("sim00000", T, 9.5, ingested=10.25, due=9.0, received=10.0, streamed=9.7)
    parts = bench_fleet.breakdown([p], [(10.0, 10.5), (11.0, 11.4)], since=0, until=100)
    assert {k: round(v[0], 6) for k, v in parts.items()} == {
        "late": 0.5, "to_stream": 0.2, "in_stream": 0.3, "write": 0.25, "wait": 0.75, "pass": 0.4, "lag": 1.9,
        "lag_from_due": 2.4}
    assert sum(parts[k][0] for k in ("to_stream", "in_stream", "write", "wait", "pass")) == pytest.approx(
        parts["lag"][0])
    assert parts["lag_from_due"][0] == pytest.approx(parts["late"][0] + parts["lag"][0])
    # The same probe by the figure's own rule: the parts describe the lag the bench reports.
    assert evaluation_lags([p], [(10.0, 10.5), (11.0, 11.4)], since=0, until=100) == [pytest.approx(1.9)]


@pytest.mark.parametrize("probe_, since, until", [
    (Probe("sim00000", T, 9.5, ingested=10.25, due=9.0, received=None, streamed=9.7), 0, 100),  # not in health's log
    (Probe("sim00000", T, 9.5, ingested=None, due=9.0, received=10.0, streamed=9.7), 0, 100),  # never stored
    (Probe("sim00000", T, 9.5, ingested=10.25, due=None, received=10.0, streamed=9.7), 0, 100),  # no schedule
    (Probe("sim00000", T, 9.5, ingested=10.25, due=9.0, received=10.0, streamed=9.7), 9.6, 100),  # sent before the window
    (Probe("sim00000", T, 9.5, ingested=10.25, due=9.0, received=10.0, streamed=9.7), 0, 9.5),  # sent at its end
    (Probe("sim00000", T, 9.5, ingested=11.5, due=9.0, received=10.0, streamed=9.7), 0, 100),  # no pass after its commit
])
def test_a_probe_without_every_part_is_left_out_of_the_breakdown(probe_, since, until):
    parts = bench_fleet.breakdown([probe_], [(10.0, 10.5), (11.0, 11.4)], since=since, until=until)
    assert parts == {k: [] for k in bench_fleet.PARTS}


def test_the_killed_are_every_hundredth_executor_that_is_up():
    fleet = [SimExecutor(f"sim{i:05d}", beats=0 if i in (150, 350) else 1) for i in range(500)]
    assert bench_fleet.choose_killed(fleet, 5) == (["sim00050", "sim00250", "sim00450"], 2)
    assert bench_fleet.choose_killed(fleet, 1) == (["sim00050"], 0)
    assert bench_fleet.choose_killed(fleet[:40], 1) == ([], 0)


def test_false_no_signal_leaves_out_the_killed_and_abandoned_jobs_only():
    executors = {"sim00001": 1.0, "sim00002": 2.0}
    jobs = {"j1": "sim00001 running", "j2": "sim00003 running", "j3": "sim00004 running"}
    false_exec, false_jobs, abandoned = bench_fleet.false_no_signal(executors, jobs, {"sim00001"}, {"j3"})
    assert false_exec == ["sim00002"] and false_jobs == ["job j2 (sim00003 running)"] and abandoned == 1
    assert bench_fleet.false_no_signal(executors, jobs, set(), set()) == (
        ["sim00001", "sim00002"], ["job j1 (sim00001 running)", "job j2 (sim00003 running)",
                                   "job j3 (sim00004 running)"], 0)


@pytest.mark.parametrize("reply, seconds", [
    ("$JS.ACK.fleet_HB.health-heartbeats.1.52.40.1796152410168223000.3", 1796152410.168223),
    ("$JS.ACK.hub.acc123.fleet_HB.health-heartbeats.1.52.40.1796152410168223000.3.tok", 1796152410.168223),
    ("$JS.ACK.hub.acc123.fleet_HB.health-heartbeats.1.52.40.1796152410168223000.3", 1796152410.168223),
    (None, 0.0), ("_INBOX.abc", 0.0), ("$JS.ACK.too.short", 0.0)])
def test_a_heartbeats_time_in_the_stream_is_read_from_its_ack_subject(reply, seconds):
    assert _fleet_service.stream_time(reply) == pytest.approx(seconds)


def test_a_killed_executor_is_found_by_the_poll_or_else_by_its_row_after_the_window():
    polled = {"a": 61.0, "z": 3.0}  # z was not killed
    final = {"a": "no_signal", "b": "no_signal", "c": "ok", "d": None}
    assert bench_fleet.found_at(["a", "b", "c", "d", "e"], polled, final, read_at=75.5) == {"a": 61.0, "b": 75.5}
    assert bench_fleet.found_at([], polled, final, read_at=75.5) == {}
