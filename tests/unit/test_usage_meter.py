"""The executor's usage meter: records cover a process's whole running time, wait until acknowledged, and a
bounded backlog never drops time (it grows the open stretch instead)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.executor.heartbeat import MAX_STRETCH_SECONDS, UsageMeter

pytestmark = pytest.mark.unit
T0 = datetime(2026, 12, 1, 4, 0, tzinfo=UTC)


def test_records_carry_the_stretch_they_cover_in_wall_clock_time():
    meter = UsageMeter()
    meter.start("j", 3, devices=2, now=100.0, at=T0)
    meter.tick(101.5)
    meter.finish(104.0)
    first, last = meter.due(10)
    assert (first.seq, first.wall_seconds, first.started_at, first.ended_at) == (1, 1.5, T0,
                                                                                T0 + timedelta(seconds=1.5))
    assert (last.seq, last.wall_seconds, last.started_at) == (2, 2.5, first.ended_at)
    assert last.ended_at == T0 + timedelta(seconds=4) and {first.devices, last.devices} == {2}
    assert (first.last, last.last) == (False, True)  # the record cut at the exit says the run is complete


def test_nothing_is_forgotten_until_acknowledged_and_a_retry_is_the_same_record():
    meter = UsageMeter()
    meter.start("j", 1, devices=1, now=0.0)
    meter.tick(1.0)
    meter.tick(2.0)
    unsent = meter.due(10)
    assert meter.due(10) == unsent and meter.due(1) == unsent[:1]  # a failed send: the same records again
    meter.acknowledged(unsent[:1])
    assert meter.due(10) == unsent[1:] and meter.backlog == 1
    meter.acknowledged(unsent[:1])  # a late second ack of the same records forgets nothing more
    assert meter.backlog == 1


def test_idle_meter_has_nothing_to_report():
    meter = UsageMeter()
    meter.tick(5.0)
    assert meter.due(10) == [] and not meter.running


def test_a_full_backlog_grows_the_open_stretch_instead_of_dropping_time():
    meter = UsageMeter(max_backlog=2)
    meter.start("j", 1, devices=1, now=0.0)
    for now in (1.0, 2.0, 3.0, 4.0, 5.0):  # the server is unreachable: nothing is acknowledged
        meter.tick(now)
    assert meter.backlog == 2  # bounded
    meter.acknowledged(meter.due(2))  # the server is back
    meter.tick(6.0)
    (grown,) = meter.due(10)
    assert grown.seq == 3 and grown.wall_seconds == 4.0  # from 2.0 to 6.0: every second still charged


def test_a_process_exit_is_cut_even_with_a_full_backlog():
    meter = UsageMeter(max_backlog=1)
    meter.start("j", 1, devices=1, now=0.0)
    meter.tick(1.0)
    meter.finish(3.0)
    assert [r.wall_seconds for r in meter.due(10)] == [1.0, 2.0]


def test_a_full_backlog_still_cuts_a_record_a_day_so_each_stays_within_the_contract():
    meter = UsageMeter(max_backlog=1)
    meter.start("j", 1, devices=1, now=0.0)
    meter.tick(1.0)
    meter.tick(MAX_STRETCH_SECONDS + 1.0)
    assert [r.wall_seconds for r in meter.due(10)] == [1.0, MAX_STRETCH_SECONDS]


def test_a_new_run_finishes_the_previous_one_and_numbers_from_one():
    meter = UsageMeter()
    meter.start("a", 1, devices=1, now=0.0)
    meter.start("a", 2, devices=1, now=2.0)
    meter.finish(3.0)
    assert [(r.epoch, r.seq, r.wall_seconds) for r in meter.due(10)] == [(1, 1, 2.0), (2, 1, 1.0)]


@given(st.lists(st.tuples(st.sampled_from(["tick", "ack", "fail"]), st.floats(0, 50)), max_size=60),
       st.integers(1, 5))
def test_whatever_the_outages_the_acknowledged_records_add_up_to_the_running_time(steps, max_backlog):
    meter, now, acked = UsageMeter(max_backlog=max_backlog), 0.0, []
    meter.start("j", 1, devices=1, now=now)
    for action, dt in steps:
        now += dt
        meter.tick(now)
        assert meter.backlog <= max_backlog
        if action == "ack":
            batch = meter.due(2)
            meter.acknowledged(batch)
            acked += batch
    meter.finish(now + 1.0)
    while meter.backlog:
        batch = meter.due(3)
        meter.acknowledged(batch)
        acked += batch
    assert [r.seq for r in acked] == list(range(1, len(acked) + 1))
    assert sum(r.wall_seconds for r in acked) == pytest.approx(now + 1.0)
