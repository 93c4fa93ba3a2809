"""What the in-memory tier's handler tests (tests/unit/test_*_inmemory.py) share: a clock the test moves, and the
service's broker run by FastStream's ``TestNatsBroker`` (libs/runtime/edge_memory.py) with no server."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

from faststream.nats import TestNatsBroker

from libs.runtime.clock import Clock
from libs.runtime.edge_memory import MemoryReporter, memory_broker

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


class FakeClock(Clock):
    """A wall clock that stands still until the test moves it."""

    def __init__(self, now: datetime = T0) -> None:
        self.at = now

    def now(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> datetime:
        self.at += timedelta(seconds=seconds)
        return self.at


@contextlib.asynccontextmanager
async def in_memory(service: str, subjects: Any, consumers: Any, responders: Any = (),
                    **context: Any) -> AsyncIterator[tuple[Any, MemoryReporter]]:
    """``service``'s declarations running on ``TestNatsBroker`` with ``context`` for its handlers: yields the test
    broker (``publish`` a message, ``request`` a reply) and the reporter that kept refusals and dead letters."""
    broker, reporter = memory_broker(service, subjects, consumers, responders, **context)
    async with TestNatsBroker(broker) as bus:
        yield bus, reporter
