"""The health service's heartbeat writes (services/health/store.py): a batch arrives in stream order,
interleaving executors; its rows are locked in key order (``lock_rows``: one statement, ORDER BY the key), as
the evaluator locks them, so two transactions on the same executors (a heartbeat batch and the evaluator's
pass) never each hold a row the other wants (PostgreSQL aborted one of them under load). Within one executor or
job the heartbeats are folded oldest first, stream order within one send time, so the newest wins."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from libs.contracts.telemetry import Heartbeat
from services.health.store import executor_beats, job_beats_of

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def beat(executor: str, seconds: float, job: str | None = None, step: int | None = None) -> Heartbeat:
    return Heartbeat(executor_id=executor, node_id=f"n-{executor}", group="g", sent_at=T0 + timedelta(seconds=seconds),
                     job_id=job, epoch=1 if job else None, step=step, interval_seconds=30,
                     progress_interval_seconds=30)


def test_each_executor_s_heartbeats_oldest_first_and_stream_order_within_one_send_time():
    beats = [beat("ex2", 3), beat("ex1", 2), beat("ex2", 1), beat("ex0", 5), beat("ex1", 0),
             beat("ex0", 5, step=7), beat("ex0", 5, step=8)]
    grouped = executor_beats(beats, T0 + timedelta(hours=1))
    assert {ex: [(b.at, b.progress[0]) for b in bs] for ex, bs in grouped.items()} == {
        "ex0": [(T0 + timedelta(seconds=5), None), (T0 + timedelta(seconds=5), 7), (T0 + timedelta(seconds=5), 8)],
        "ex1": [(T0, None), (T0 + timedelta(seconds=2), None)],
        "ex2": [(T0 + timedelta(seconds=1), None), (T0 + timedelta(seconds=3), None)]}


def test_job_beats_are_only_those_about_a_job_oldest_first():
    beats = [beat("a", 4, job="j2"), beat("b", 1, job="j1"), beat("c", 2), beat("a", 0, job="j2")]
    grouped = job_beats_of(beats, T0 + timedelta(hours=1))
    assert {j: [(b.columns[0], b.at) for b in bs] for j, bs in grouped.items()} == {
        "j1": [("b", T0 + timedelta(seconds=1))], "j2": [("a", T0), ("a", T0 + timedelta(seconds=4))]}


def test_a_send_time_ahead_of_the_service_clock_is_clamped_to_now():
    now = T0 + timedelta(seconds=1)
    assert [b.at for b in executor_beats([beat("ex0", 60)], now)["ex0"]] == [now]
