"""The health service's heartbeat writes take their row locks in key order (services/health/store.py): a batch
arrives in stream order, interleaving executors; written in that order, two transactions on the same executors
(a heartbeat batch and the evaluator's pass) could each hold a row the other wants, and PostgreSQL aborted one
of them (seen under load: the evaluator's pass, and a heartbeat batch that then fell back to one message per
transaction). Within one executor or job the oldest still comes first, so the newest wins."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from libs.contracts.telemetry import Heartbeat
from services.health.store import executor_rows, job_rows

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def beat(executor: str, seconds: float, job: str | None = None) -> Heartbeat:
    return Heartbeat(executor_id=executor, node_id=f"n-{executor}", group="g", sent_at=T0 + timedelta(seconds=seconds),
                     job_id=job, epoch=1 if job else None, interval_seconds=30, progress_interval_seconds=30)


def test_executor_rows_are_in_executor_order_and_oldest_first_within_one_executor():
    beats = [beat("ex2", 3), beat("ex1", 2), beat("ex2", 1), beat("ex0", 5), beat("ex1", 0)]
    rows = executor_rows(beats, T0 + timedelta(hours=1))
    assert [(r[0], r[9]) for r in rows] == [
        ("ex0", T0 + timedelta(seconds=5)), ("ex1", T0), ("ex1", T0 + timedelta(seconds=2)),
        ("ex2", T0 + timedelta(seconds=1)), ("ex2", T0 + timedelta(seconds=3))]


def test_job_rows_are_in_job_order_oldest_first_and_only_beats_about_a_job():
    beats = [beat("a", 4, job="j2"), beat("b", 1, job="j1"), beat("c", 2), beat("a", 0, job="j2")]
    rows = job_rows(beats, T0 + timedelta(hours=1))
    assert [(r[0], r[2], r[3]) for r in rows] == [
        ("j1", "b", T0 + timedelta(seconds=1)), ("j2", "a", T0), ("j2", "a", T0 + timedelta(seconds=4))]


def test_a_send_time_ahead_of_the_service_clock_is_clamped_to_now():
    now = T0 + timedelta(seconds=1)
    (row,) = executor_rows([beat("ex0", 60)], now)
    assert row[9] == now
