"""A part's start-up check of its streams (libs/runtime/bus.check_streams) asks again while a NATS cluster
elects leaders, and still fails at once on a stream that does not exist."""

from __future__ import annotations

import nats
import pytest
from nats.js.errors import NotFoundError

from libs.runtime import bus


class FlakyJetStream:
    def __init__(self, failures: list[BaseException]) -> None:
        self.failures = list(failures)
        self.asked: list[str] = []

    async def stream_info(self, name: str) -> object:
        self.asked.append(name)
        if self.failures:
            raise self.failures.pop(0)
        return object()


async def test_unanswered_checks_are_asked_again_until_answered():
    js = FlakyJetStream([nats.errors.TimeoutError(), nats.errors.NoRespondersError()])
    await bus.check_streams(js, ["TETO_CMD", "TETO_HB"], every=0)
    assert js.asked == ["TETO_CMD", "TETO_CMD", "TETO_CMD", "TETO_HB"]


async def test_a_missing_stream_fails_at_once():
    js = FlakyJetStream([NotFoundError()])
    with pytest.raises(RuntimeError, match="TETO_CMD does not exist"):
        await bus.check_streams(js, ["TETO_CMD"], every=0)
    assert js.asked == ["TETO_CMD"]


async def test_checks_unanswered_past_the_patience_fail():
    js = FlakyJetStream([nats.errors.TimeoutError()] * 1000)
    with pytest.raises(nats.errors.TimeoutError):
        await bus.check_streams(js, ["TETO_CMD"], patience=0.05, every=0.01)
