"""Settings of the health service (``TETO_*`` environment variables)."""

from __future__ import annotations

from pydantic import Field

from libs.runtime.settings import CommonSettings, SettingsError

from .domain.signals import Thresholds


class HealthSettings(CommonSettings):
    signal_timeout_seconds: float | None = Field(
        None, gt=0, le=86400, description="Silence after which an executor is no_signal (default: 2 heartbeats)"
    )
    stuck_after_seconds: float = Field(
        120.0, gt=0, le=7 * 86400, description="A training step standing still this long is stuck (at least 2 "
        "progress intervals, whatever this says)"
    )
    evaluate_interval_seconds: float = Field(1.0, gt=0, le=60, description="How often signals are re-derived")

    @property
    def effective_signal_timeout(self) -> float:
        return self.signal_timeout_seconds if self.signal_timeout_seconds is not None else 2 * self.heartbeat_seconds

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(self.effective_signal_timeout, self.stuck_after_seconds)

    def check(self) -> None:
        super().check()
        if self.effective_signal_timeout < self.heartbeat_seconds:
            raise SettingsError(
                f"signal timeout {self.effective_signal_timeout:g}s is shorter than one heartbeat "
                f"({self.heartbeat_seconds:g}s): every healthy executor would flap to no_signal"
            )
