"""The fleet bench's arithmetic (bench/bench_fleet.py): a probe heartbeat's signal evaluation lag is measured to
the end of the first evaluator pass that began after health stored it, and a fleet size holds only with
signals judged within 2 s, no false no_signal and every killed executor found."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bench._fleet import Probe
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
