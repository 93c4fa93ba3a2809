"""The budget's heartbeat consumer decodes only heartbeats that may carry a usage sample
(services/budget/handlers.py ``may_carry_usage``): a heartbeat of a current agent, encoded as every Teto sender
encodes it, is acknowledged unread; one with a sample, or encoded some other way, is decoded as before."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from libs.contracts.telemetry import Heartbeat, UsageSample
from services.budget.handlers import may_carry_usage

pytestmark = pytest.mark.unit


def heartbeat(**kw) -> Heartbeat:
    return Heartbeat(executor_id="ex1", node_id="n1", group="g", sent_at=datetime(2026, 12, 1, tzinfo=UTC),
                     interval_seconds=30, progress_interval_seconds=30, **kw)


def test_a_heartbeat_without_usage_is_skipped():
    assert not may_carry_usage(heartbeat(job_id="j1", epoch=1, step=3).encode())


def test_a_heartbeat_with_a_usage_sample_is_read():
    beat = heartbeat(job_id="j1", epoch=1, usage=UsageSample(job_id="j1", epoch=1, seq=4, devices=2, wall_seconds=30))
    assert may_carry_usage(beat.encode())


def test_a_heartbeat_encoded_another_way_is_read():
    body = json.dumps(json.loads(heartbeat().encode()), indent=1).encode()
    assert b'"usage": null' in body and may_carry_usage(body)
