"""Whether a service's background loops are working: a loop that keeps raising is a problem ``GET /v1/status``
names, not only lines in a log (issue 26, item 4: every placement pass failed, several tracebacks a second, while
the status said ok).

``singleton.periodic`` reports each tick here: a failure is counted, a success clears the loop. The runtime gives
each of its tasks its own ``LoopHealth`` through a context variable (several services share a process in tests),
and its status reply lists the loops failing now (``ReplicaStatus.failing_loops``).
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime

from libs.contracts.status import FailingLoop

# One failed tick is news (the database restarting); this many in a row, with none between, is a problem.
FAILING_AFTER = 3


@dataclass
class _Failures:
    count: int
    since: datetime
    error: str


class LoopHealth:
    """Consecutive failures of each named loop of one service replica."""

    def __init__(self, failing_after: int = FAILING_AFTER) -> None:
        self.failing_after = failing_after
        self._failures: dict[str, _Failures] = {}

    def failed(self, name: str, exc: BaseException, now: datetime | None = None) -> None:
        error = f"{type(exc).__name__}: {exc}"[:1000]
        was = self._failures.get(name)
        now = now or datetime.now(UTC)
        self._failures[name] = _Failures(was.count + 1, was.since, error) if was else _Failures(1, now, error)

    def succeeded(self, name: str) -> None:
        self._failures.pop(name, None)

    def failing(self) -> list[FailingLoop]:
        return [FailingLoop(name=name, failures=f.count, since=f.since, error=f.error)
                for name, f in sorted(self._failures.items()) if f.count >= self.failing_after]


CURRENT: ContextVar[LoopHealth | None] = ContextVar("teto_loop_health", default=None)
