"""One grant being served by the agent, and what its training process has reported so far (a value object)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from libs.contracts.agents import RunJob
from libs.contracts.telemetry import Phase, RunOutcome

from .lease import LeaseLost
from .logsender import RunLog
from .runner import Child


@dataclass
class Run:
    """One grant being served, and what its process has reported."""

    grant: RunJob
    phase: Phase = Phase.STARTING
    child: Child | None = None
    step: int | None = None
    resumed_from_step: int | None = None
    stop_requested: bool = False
    stop_grace_seconds: float | None = None  # the grace the stop carried (the queue's setting)
    stop_reason: str | None = None  # why it was stopped (gpu_ceiling: reported, so the queue interrupts the job)
    lost: LeaseLost | None = None
    pending_step: dict[str, Any] | None = None
    last_step_sent_at: float | None = None
    step_seconds_sum: float = 0.0
    step_seconds_n: int = 0
    launched_at: float | None = None  # monotonic
    ready: bool = False  # a gang worker's process group has formed
    log: RunLog | None = None  # its output on the way to the bus
    ended: bool = False  # its end is reported (being acknowledged): a new grant waits for it, not handed back

    def outcome(self, rc: int) -> RunOutcome:
        """How the run ended, its process having exited with ``rc``: a lost lease first (abandoned, a free
        requeue), then a stop the agent was asked for, then the exit status."""
        if self.lost is not None:
            return RunOutcome.ABANDONED
        if self.stop_requested:
            return RunOutcome.STOPPED
        return RunOutcome.SUCCEEDED if rc == 0 else RunOutcome.FAILED

    def error(self, rc: int) -> str | None:
        """What went wrong, for the job's ``error``: the lost lease's reason, or the exit status with the end of
        the process's stderr (at most 8,000 characters, the end kept); None for a clean exit."""
        if self.lost is not None:
            return self.lost.reason
        if rc == 0:
            return None
        tail = self.child.stderr_tail().strip() if self.child else ""
        status = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
        return (f"{status}: {tail}" if tail else status)[-8000:]
