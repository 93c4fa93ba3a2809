"""The budget's heartbeat consumer decodes only heartbeats that may carry a usage sample
(services/budget/handlers.py ``may_carry_usage``): a heartbeat of a current agent, encoded as every Teto sender
encodes it, is acknowledged unread; one with a sample, or encoded some other way, is decoded as before."""

from __future__ import annotations

import json

import pytest

from libs.contracts.telemetry import UsageSample
from services.budget.handlers import may_carry_usage
from tests.support import builders

pytestmark = pytest.mark.unit


def test_a_heartbeat_without_usage_is_skipped():
    assert not may_carry_usage(builders.heartbeat(job_id="j1", epoch=1, step=3).encode())


def test_a_heartbeat_with_a_usage_sample_is_read():
    usage = UsageSample(job_id="j1", epoch=1, seq=4, devices=2, wall_seconds=30)
    beat = builders.heartbeat(job_id="j1", epoch=1, usage=usage)
    assert may_carry_usage(beat.encode())


def test_a_heartbeat_encoded_another_way_is_read():
    body = json.dumps(json.loads(builders.heartbeat().encode()), indent=1).encode()
    assert b'"usage": null' in body and may_carry_usage(body)
