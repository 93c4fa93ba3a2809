"""The clock, injected: domain code takes ``now`` as an argument; services read it here."""

from __future__ import annotations

import time
from datetime import UTC, datetime


class Clock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()
