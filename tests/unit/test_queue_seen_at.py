"""An executor is seen when the bus stored its heartbeat, not when the queue read it (issue 26, item 1: after a
database outage a backlog of heartbeats made executors that had died meanwhile look alive, and they were leased
jobs)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from libs.runtime.acksubject import stored_at
from libs.runtime.edge import Stamped, stamped
from services.queue.domain.liveness import seen_at

pytestmark = pytest.mark.unit

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("stored", "expected"), [
    (NOW - timedelta(seconds=40), NOW - timedelta(seconds=40)),  # a backlog read late: seen when said
    (NOW + timedelta(seconds=3), NOW),  # a server clock ahead: never seen in the future
    (None, NOW),  # not from a stream: seen now
], ids=["read late", "clock ahead", "unknown"])
def test_seen_at_is_the_stream_time_never_later_than_now(stored, expected):
    assert seen_at(NOW, stored) == expected


def _msg(reply: str) -> SimpleNamespace:
    return SimpleNamespace(reply=reply, data=b"x", subject="s")


def test_the_stream_time_is_read_from_both_forms_of_the_ack_subject():
    ns = int(datetime(2026, 12, 4, 11, 59, 20, tzinfo=UTC).timestamp() * 1e9)
    short = _msg(f"$JS.ACK.HB.queue-heartbeats.1.42.7.{ns}.0")
    long = _msg(f"$JS.ACK.domain.acchash.HB.queue-heartbeats.1.42.7.{ns}.0.token")
    assert stored_at(short) == stored_at(long) == datetime(2026, 12, 4, 11, 59, 20, tzinfo=UTC)
    assert stored_at(_msg("_INBOX.abc")) is None


def test_a_stamped_read_keeps_the_value_and_its_stream_time():
    ns = int(NOW.timestamp() * 1e9)
    out = stamped(lambda m: m.data)(_msg(f"$JS.ACK.HB.c.1.2.3.{ns}.0"))
    assert out == Stamped(b"x", NOW)
