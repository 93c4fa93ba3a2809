"""How health writes a batch of heartbeats or job events (services/health/store): rows oldest first (stream
order within one send time), split into rounds so that one upsert statement never touches a row twice and each
row's updates land in order; the first round names every key, so it takes all the batch's row locks in key
order (its ORDER BY), as the evaluator takes them (two writers locking in different orders deadlocked under
load)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from libs.contracts.telemetry import Heartbeat
from libs.contracts.nodes import NodeRegistered
from services.health.store import executor_rows, job_rows, registration_rows, rounds

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def beat(executor: str, seconds: float, job: str | None = None, step: int | None = None) -> Heartbeat:
    return Heartbeat(executor_id=executor, node_id=f"n-{executor}", group="g", sent_at=T0 + timedelta(seconds=seconds),
                     job_id=job, epoch=1 if job else None, step=step, interval_seconds=30,
                     progress_interval_seconds=30)


def test_executor_rows_are_oldest_first_and_in_stream_order_within_one_send_time():
    beats = [beat("ex2", 3), beat("ex1", 2), beat("ex0", 5, step=7), beat("ex1", 0), beat("ex0", 5, step=8)]
    rows = executor_rows(beats, T0 + timedelta(hours=1))
    assert [(r[0], r[6]) for r in rows] == [("ex1", None), ("ex1", None), ("ex2", None), ("ex0", 7), ("ex0", 8)]


def test_job_rows_are_only_beats_about_a_job_oldest_first():
    beats = [beat("a", 4, job="j2"), beat("b", 1, job="j1"), beat("c", 2), beat("a", 0, job="j2")]
    rows = job_rows(beats, T0 + timedelta(hours=1))
    assert [(r[0], r[2], r[3]) for r in rows] == [
        ("j2", "a", T0), ("j1", "b", T0 + timedelta(seconds=1)), ("j2", "a", T0 + timedelta(seconds=4))]


def test_a_send_time_ahead_of_the_service_clock_is_clamped_to_now():
    now = T0 + timedelta(seconds=1)
    (row,) = executor_rows([beat("ex0", 60)], now)
    assert row[9] == now


def test_one_row_per_key_is_one_round():
    rows = [("b", 1), ("a", 2), ("c", 3)]
    assert rounds(rows) == [rows]


@pytest.mark.parametrize("n", range(1, 7))
def test_rounds_hold_each_key_once_keep_each_key_s_order_and_the_first_names_every_key(n):
    for keys in itertools.product("abc", repeat=n):
        rows = [(k, i) for i, k in enumerate(keys)]
        out = rounds(rows)
        assert all(len({k for k, _ in part}) == len(part) for part in out)
        assert {k for k, _ in out[0]} == set(keys)
        assert len(out) == max(keys.count(k) for k in set(keys))
        for key in set(keys):
            assert [i for part in out for k, i in part if k == key] == [i for k, i in rows if k == key]


def registration(executor: str, n: int) -> NodeRegistered:
    return NodeRegistered(node_id=f"node-{executor}", executor_id=executor, group=f"g{n}", hostname="h",
                          cpu_count=1, agent_version="t", time=T0 + timedelta(seconds=n))


@pytest.mark.parametrize("size", range(6))
def test_registrations_are_written_in_key_order_each_executors_last_one_last(size):
    # Every batch of up to five registrations over three executors, in every stream order.
    for keys in itertools.product(["ex2", "ex0", "ex1"], repeat=size):
        regs = [registration(k, i) for i, k in enumerate(keys)]
        rows = registration_rows(regs)
        assert [r[0] for r in rows] == sorted(keys)
        for key in set(keys):  # each executor's registrations keep their stream order
            assert [r[2] for r in rows if r[0] == key] == [f"g{i}" for i, k in enumerate(keys) if k == key]
