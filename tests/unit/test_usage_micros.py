"""``store.micros`` (services/budget/store.py): how a usage batch's JSON carries a time. Whole microseconds since
1970 while PostgreSQL's float8 interval product is exact (below 2**53), the ISO text (``store.utc``) beyond;
a naive time is the machine's local time, as asyncpg converts one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from services.budget.store import micros, utc

pytestmark = pytest.mark.unit


def test_a_time_is_its_microseconds_since_1970_whatever_its_offset():
    at = datetime(2026, 12, 1, 12, 0, 0, 123_457, tzinfo=UTC)
    assert micros(at) == 1_796_126_400_123_457
    assert micros(at.astimezone(timezone(timedelta(hours=5, minutes=45)))) == 1_796_126_400_123_457
    assert micros(datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)) == -1
    assert micros(None) is None


def test_a_naive_time_is_read_as_the_machines_local_time():
    naive = datetime(2026, 6, 1, 8, 30, 0, 5)
    assert micros(naive) == micros(naive.astimezone(UTC))


def test_beyond_what_a_float8_holds_exactly_the_time_travels_as_text():
    edge = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=2 ** 53 - 1)
    assert micros(edge) == 2 ** 53 - 1
    past = edge + timedelta(microseconds=1)
    assert micros(past) == utc(past) == past.isoformat()
    old = datetime(1, 1, 1, tzinfo=UTC)
    assert micros(old) == utc(old)
