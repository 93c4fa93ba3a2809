"""The job list's cursor: opaque, round-trips a position exactly, and refuses what this gateway did not make."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import pytest

from services.gateway.domain.paging import BadCursor, Position, decode_cursor, encode_cursor, page

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 1, 10, 0, 0, 123456, tzinfo=UTC)


def test_a_cursor_round_trips_its_position_to_the_microsecond():
    pos = Position(T0, "job-7_x")
    text = encode_cursor(pos)
    assert decode_cursor(text) == pos
    assert "=" not in text and "/" not in text and "+" not in text  # safe in a query string as it is


def _b64(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize("text", [
    "", "not base64 !", "x" * 600, _b64("[1, 2]"), _b64("{}"), _b64('{"v": 2, "t": "2026-12-01T10:00:00+00:00", "i": "j"}'),
    _b64('{"v": 1, "t": "yesterday", "i": "j"}'), _b64('{"v": 1, "t": "2026-12-01T10:00:00", "i": "j"}'),
    _b64('{"v": 1, "t": "2026-12-01T10:00:00+00:00", "i": "a b"}'), _b64('{"v": 1, "t": "2026-12-01T10:00:00+00:00"}'),
    _b64('{"v": 1, "t": 5, "i": "j"}'), base64.urlsafe_b64encode(b"\xff\xfe").decode(),
], ids=["empty", "not-base64", "too-long", "a-list", "no-version", "other-version", "bad-time", "naive-time",
        "bad-id", "no-id", "time-not-text", "not-utf8"])
def test_a_cursor_this_gateway_did_not_make_is_refused(text):
    with pytest.raises(BadCursor, match="start again"):
        decode_cursor(text)


def _rows(n: int) -> list[dict]:
    return [{"id": f"j{i}", "created_at": T0 - timedelta(seconds=i)} for i in range(n)]


def test_a_page_with_more_behind_it_names_its_last_job():
    kept, cursor = page(_rows(4), 3)
    assert [r["id"] for r in kept] == ["j0", "j1", "j2"]
    assert decode_cursor(cursor) == Position(T0 - timedelta(seconds=2), "j2")


@pytest.mark.parametrize("n", [0, 2, 3])
def test_the_last_page_has_no_cursor(n):
    kept, cursor = page(_rows(n), 3)
    assert len(kept) == n and cursor is None


def test_the_cursor_is_json_inside_but_carries_only_the_position():
    body = json.loads(base64.urlsafe_b64decode(encode_cursor(Position(T0, "j")) + "=="))
    assert set(body) == {"v", "t", "i"}
