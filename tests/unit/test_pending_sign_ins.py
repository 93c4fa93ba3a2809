"""The bounds on pending provider sign-ins an unauthenticated client can make the gateway store
(services/gateway/domain/pending.py): per source address through the attempts limiter, and a cap for the whole
installation with the wait until a place frees."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.gateway.domain.attempts import Attempts, Limit, Scope
from services.gateway.domain.pending import Full, admit, start_limit

T0 = datetime(2026, 12, 5, 4, 0, tzinfo=UTC)
SOURCE = (Scope.SIGN_IN_START, "203.0.113.9")


def _limiter(starts: int, window: float = 60.0, block: float = 120.0) -> Attempts:
    return Attempts({Scope.SIGN_IN_START: start_limit(starts, window, block), Scope.SOURCE: Limit(5, 60, 60)})


@pytest.mark.parametrize("pending", [0, 1, 9], ids=lambda n: f"{n} of 10")
def test_a_start_below_the_cap_is_admitted(pending):
    assert admit(pending, cap=10, oldest_expires_at=T0 + timedelta(minutes=3), now=T0) is None


@pytest.mark.parametrize("pending", [10, 11, 500], ids=lambda n: f"{n} of 10")
def test_a_start_at_or_over_the_cap_waits_for_the_oldest_to_expire(pending):
    full = admit(pending, cap=10, oldest_expires_at=T0 + timedelta(seconds=250), now=T0)
    assert full == Full(pending=pending, cap=10, retry_after=250.0)
    assert "250 s" in full.reason and f"{pending} of at most 10" in full.reason


@pytest.mark.parametrize("oldest", [T0, T0 - timedelta(seconds=5), None], ids=["expiring now", "expired", "unknown"])
def test_the_wait_is_at_least_a_second(oldest):
    assert admit(3, cap=3, oldest_expires_at=oldest, now=T0).retry_after == 1.0


def test_a_cap_of_one_admits_exactly_one():
    assert admit(0, cap=1, oldest_expires_at=None, now=T0) is None
    assert admit(1, cap=1, oldest_expires_at=T0 + timedelta(seconds=30), now=T0) is not None


@pytest.mark.parametrize("starts", [1, 3, 30])
def test_a_source_may_start_its_allowance_and_the_next_start_blocks_it(starts):
    limiter = _limiter(starts)
    verdicts = [limiter.on_failure(SOURCE, float(t)) for t in range(starts)]
    assert all(v.blocked_for is None for v in verdicts)
    over = limiter.on_failure(SOURCE, float(starts))
    assert over.blocked_for == 120.0 and over.record and over.failures == starts + 1
    assert limiter.blocked_for(SOURCE, float(starts) + 1) == pytest.approx(119.0)


def test_the_block_ends_on_its_own_and_the_allowance_is_whole_again():
    limiter = _limiter(2, window=60, block=120)
    for t in (0.0, 1.0, 2.0):
        limiter.on_failure(SOURCE, t)
    assert limiter.blocked_for(SOURCE, 121.0) is not None
    assert limiter.blocked_for(SOURCE, 122.0) is None
    assert [limiter.on_failure(SOURCE, t).blocked_for for t in (123.0, 124.0)] == [None, None]


def test_starts_older_than_the_window_no_longer_count():
    limiter = _limiter(2, window=60)
    limiter.on_failure(SOURCE, 0.0)
    limiter.on_failure(SOURCE, 10.0)
    assert limiter.on_failure(SOURCE, 61.0).blocked_for is None  # the start at 0 left the window
    assert limiter.on_failure(SOURCE, 62.0).blocked_for == 120.0  # 10, 61, 62: three within 60 s


def test_starts_are_counted_apart_from_failures_of_the_same_address():
    limiter = _limiter(1)
    limiter.on_failure(SOURCE, 0.0)
    assert limiter.on_failure(SOURCE, 1.0).blocked_for is not None
    assert limiter.blocked_for((Scope.SOURCE, SOURCE[1]), 2.0) is None  # its tokens are not refused for it
    other = (Scope.SIGN_IN_START, "198.51.100.7")
    assert limiter.on_failure(other, 2.0).blocked_for is None
