"""One grant being served by the agent, and what its training process has reported so far (a value object)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from libs.contracts.agents import RunJob
from libs.contracts.telemetry import Phase

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
