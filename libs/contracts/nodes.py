"""Nodes and executors: registration by the agent (``teto.node.<node_id>.registered``) and signals.

Signals (``no_signal``, ``stuck``) are derived by the health service and published as job events
(``teto.job.<job_id>.signal``) so that the job badge and the executor list always agree.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from .envelope import Envelope
from .telemetry import GpuInfo


class NodeRegistered(Envelope):
    SCHEMA = "teto.node.registered/1"

    node_id: str
    executor_id: str
    group: str
    hostname: str
    gpus: list[GpuInfo] = Field(default_factory=list)
    cpu_count: int = Field(ge=1)
    torch_version: str | None = None
    agent_version: str


class Signal(StrEnum):
    OK = "ok"  # heartbeats fresh and (when training) steps advancing
    NO_SIGNAL = "no_signal"  # heartbeats stopped for longer than signal_timeout
    STUCK = "stuck"  # heartbeats fresh, training, step not advancing past the threshold


class SignalChanged(Envelope):
    SCHEMA = "teto.job.signal/1"

    job_id: str
    executor_id: str | None
    signal: Signal | None
    previous: Signal | None
    since: datetime
    seconds_since_heartbeat: float | None = None
    seconds_since_step_change: float | None = None
    no_signal_after_seconds: float
    stuck_after_seconds: float
