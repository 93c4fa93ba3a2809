"""What a check test is given and what it gives back (suite.py, nvml.py): the run's ``Spec`` and a test's ``Result``
(status, figures with their units in their names, detail, error).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Spec:
    tests: list[str]
    fault: dict[str, str] = field(default_factory=dict)
    device: str = "auto"  # auto: cuda when available
    memtest_fraction: float = 0.05
    memtest_max_mb: float | None = None  # cap (CPU default 32 MB)
    peers: list[dict[str, str]] = field(default_factory=list)
    rank: int = 0
    world_size: int = 1
    rendezvous: str | None = None
    collective_timeout_seconds: float = 60.0
    bind_host: str | None = None  # this node's advertised address: the only one its collective listeners use


@dataclass
class Result:
    status: str  # passed, failed, not_applicable
    figures: dict[str, float] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
