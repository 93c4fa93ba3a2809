"""The health evaluator reads only the executors and jobs whose signal can have changed (services/health/store/
signals.py ``DUE_EXECUTORS``, ``DUE_JOBS``), and never leaves out one whose verdict (``executor_signal``, ``job_signal``:
the pure rules) differs from its stored signal: checked over a grid of every stored signal, heartbeat age and
step age around the thresholds (to the millisecond), phase, step, progress interval and, for jobs, state, against
real PostgreSQL. A steady fleet is not read."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from libs.runtime.service import Runtime
from services.health import store
from services.health.domain.signals import Thresholds, due_bounds, executor_signal
from services.health.evaluator import reading_of, state_of
from services.health.store import signals
from services.health.settings import HealthSettings

pytestmark = pytest.mark.integration

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
TH = Thresholds(signal_timeout_seconds=60.0, stuck_after_seconds=120.0)


def _ages(threshold: float) -> list[float | None]:
    return [None, -5.0, 0.0, threshold - 0.002, threshold - 0.0005, threshold, threshold + 0.0005,
            threshold + 0.002, threshold + 50]


def _ago(age: float | None) -> datetime | None:
    return None if age is None else NOW - timedelta(seconds=age)


async def _stored_and_due(runtime, table: str, key: str, columns: str, rows: list[tuple], due_sql: str, *args):
    """Store ``rows`` in ``table``; every row stored, and the keys ``due_sql`` reads."""
    async with runtime.pool.acquire() as conn:
        await conn.executemany(f"INSERT INTO health.{table} ({columns}) VALUES "
                               f"({', '.join(f'${i + 1}' for i in range(len(rows[0])))})", rows)
        return await conn.fetch(f"SELECT * FROM health.{table}"), {r[key] for r in await conn.fetch(due_sql, *args)}


def _check_read(every, due: set[str], key: str, judged) -> None:
    """Every row whose verdict (``judged(row)``) differs from its stored signal is in ``due``; only rows near a
    threshold (the 1 ms slack) are read without changing."""
    changing = {r[key] for r in every if (lambda s: s and str(s))(judged(r).signal) != r["signal"]}
    assert changing and changing <= due, sorted(changing - due)[:5]
    assert len(due - changing) < len(every) / 10, (len(due - changing), len(every))


async def test_every_executor_whose_verdict_changes_is_read_and_a_steady_one_is_not(env):
    settings = env.settings(HealthSettings)
    runtime = await Runtime.open("health", settings, schema=store.SCHEMA, package="services.health")
    try:
        rows = []
        grid = itertools.product([None, "ok", "no_signal", "stuck"], _ages(TH.signal_timeout_seconds),
                                 _ages(TH.stuck_after_seconds) + _ages(200.0), ["training", "idle", None],
                                 [None, 7], [None, 100.0])
        for i, (signal, hb_age, step_age, phase, step, progress) in enumerate(grid):
            rows.append((f"ex{i:06d}", signal, _ago(hb_age), _ago(step_age), phase, step, progress))
        every, due = await _stored_and_due(
            runtime, "executors", "executor_id",
            "executor_id, signal, last_heartbeat, step_changed_at, phase, step, progress_interval_seconds", rows,
            signals.DUE_EXECUTORS, *due_bounds(NOW, TH))
        _check_read(every, due, "executor_id", lambda r: reading_of(
            r, "last_heartbeat", None, NOW, TH, judge=executor_signal))

        # A steady fleet: fresh heartbeats, steps moving, signal ok. Nothing to read.
        async with runtime.pool.acquire() as conn:
            await conn.execute("DELETE FROM health.executors")
            await conn.executemany(
                "INSERT INTO health.executors (executor_id, signal, last_heartbeat, step_changed_at, phase, step)"
                " VALUES ($1, 'ok', $2, $2, 'training', 3)",
                [(f"ex{i:05d}", NOW - timedelta(seconds=i % 30)) for i in range(2000)])
            assert await conn.fetch(signals.DUE_EXECUTORS, *due_bounds(NOW, TH)) == []
    finally:
        await runtime.close()


async def test_every_job_whose_verdict_changes_is_read_and_a_steady_one_is_not(env):
    settings = env.settings(HealthSettings)
    runtime = await Runtime.open("health", settings, schema=store.SCHEMA, package="services.health")
    try:
        rows = []
        grid = itertools.product([None, "running", "queued", "succeeded"], [None, "ok", "no_signal", "stuck"],
                                 _ages(TH.signal_timeout_seconds), _ages(TH.stuck_after_seconds),
                                 ["training", None], [None, 7], [None, 100.0])
        for i, (state, signal, contact_age, step_age, phase, step, progress) in enumerate(grid):
            rows.append((f"j{i:06d}", state, signal, _ago(contact_age), _ago(step_age), phase, step, progress))
        every, due = await _stored_and_due(
            runtime, "jobs", "job_id",
            "job_id, state, signal, last_contact_at, step_changed_at, phase, step, progress_interval_seconds", rows,
            signals.DUE_JOBS, *due_bounds(NOW, TH), signals.APPLIES)
        # Not the queued or finished jobs without a signal, nor the steady running ones.
        _check_read(every, due, "job_id", lambda r: reading_of(
            r, "last_contact_at", state_of(r["state"]), NOW, TH))

        # A steady fleet's running jobs, and finished jobs without a signal: nothing to read.
        async with runtime.pool.acquire() as conn:
            await conn.execute("DELETE FROM health.jobs")
            await conn.executemany(
                "INSERT INTO health.jobs (job_id, state, signal, last_contact_at, step_changed_at, phase, step)"
                " VALUES ($1, $2, $3, $4, $4, 'training', 3)",
                [(f"j{i:05d}", "running" if i % 2 else "succeeded", "ok" if i % 2 else None,
                  NOW - timedelta(seconds=i % 30)) for i in range(2000)])
            assert await conn.fetch(signals.DUE_JOBS, *due_bounds(NOW, TH), signals.APPLIES) == []
    finally:
        await runtime.close()
