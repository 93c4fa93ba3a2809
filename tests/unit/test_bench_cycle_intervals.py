"""bench_cycle's arithmetic: one executor's intervals from its jobs' events (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bench.bench_cycle import intervals

pytestmark = pytest.mark.unit


def job(**times: float) -> list[dict]:
    """Events at the given seconds past 2026-12-02T10:00:00Z."""
    return [{"event": name, "time": f"2026-12-02T10:00:{t:09.6f}Z"} for name, t in times.items()]


def close(values: list[float], expected: list[float]) -> bool:
    return len(values) == len(expected) and all(abs(v - e) < 1e-6 for v, e in zip(values, expected))


def test_grant_to_start_and_end_to_next_grant_in_grant_order():
    jobs = [job(submitted=0, leased=2.0, started=2.03, succeeded=2.05),
            job(submitted=0, leased=1.0, started=1.02, succeeded=1.04),  # listed out of order: granted first
            job(submitted=0, leased=2.06, started=2.1, failed=2.2)]
    to_start, to_grant = intervals(jobs)
    assert close(to_start, [0.02, 0.03, 0.04])
    assert close(to_grant, [0.96, 0.01])  # 1.04 -> 2.0, 2.05 -> 2.06


def test_the_first_event_of_each_kind_counts_and_unfinished_or_ungranted_jobs_add_no_gap():
    jobs = [job(leased=1.0, started=1.01), job(submitted=0.5), job(leased=1.5, started=1.6, succeeded=1.7)]
    jobs[0] += job(started=1.2)  # a second start (a redelivered report) does not move the first
    to_start, to_grant = intervals(jobs)
    assert close(to_start, [0.01, 0.1])
    assert to_grant == []  # the first job never ended


def test_a_grant_before_the_previous_end_is_not_a_gap_and_early_grants_can_be_left_out():
    jobs = [job(leased=1.0, started=1.1, succeeded=1.5), job(leased=1.2, started=1.3, succeeded=1.4),
            job(leased=1.6, started=1.65, succeeded=1.7)]
    assert close(intervals(jobs)[1], [0.2])  # 1.0's end (1.5) -> 1.6 is not next: 1.2 came before it
    after = datetime(2026, 12, 2, 10, 0, 1, 100000, tzinfo=UTC).timestamp()  # only the jobs granted from then on
    to_start, to_grant = intervals(jobs, after=after)
    assert close(to_start, [0.1, 0.05]) and close(to_grant, [0.2])
