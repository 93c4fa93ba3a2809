"""Typed settings of the queue service: how often it places jobs and scans leases, and its patience with the
executors (stop grace) and with the budget service (requeue check)."""

from __future__ import annotations

from pydantic import Field

from libs.runtime.settings import CommonSettings, SettingsError


class QueueSettings(CommonSettings):
    schedule_interval_seconds: float = Field(
        0.5, gt=0, le=60, description="How often queued jobs are placed on free executors"
    )
    scan_interval_seconds: float = Field(
        1.0, gt=0, le=600, description="How often running jobs are checked for an expired lease"
    )
    stop_grace_seconds: float = Field(
        30.0, ge=0, le=3600, description="Time an executor gets to checkpoint and stop at the GPU ceiling"
    )
    budget_rpc_timeout_seconds: float = Field(
        5.0, gt=0, le=60, description="How long a requeue waits for the budget service before it is refused"
    )
    executor_silence_heartbeats: float = Field(
        2.0, ge=1, le=100, description="An executor unseen for this many heartbeats is not given work"
    )
    max_jobs_per_pass: int = Field(200, ge=1, le=100_000, description="Queued jobs considered per placement pass")
    waiting_refresh_seconds: float = Field(
        5.0, ge=0, le=3600, description="How often a whole placement pass brings the waiting reasons of the queued "
        "jobs beyond it ('behind N jobs') up to date: a job submitted meanwhile waits at most this long for its "
        "reason (0: every whole pass)")
    rendezvous_port_first: int = Field(
        29500, ge=1024, le=65535, description="First port the queue hands out for a gang's rendezvous (rank 0)")
    rendezvous_port_count: int = Field(
        1000, ge=1, le=64511, description="How many ports from rendezvous_port_first gangs may meet on")
    require_checked_nodes: bool = Field(
        True, description="Place work only on nodes the health service reports schedulable (passed their checks);"
        " when off, nodes not judged yet (joining, checking) take work too, but a ruled-out node never does")

    def check(self) -> None:
        super().check()
        if self.rendezvous_port_first + self.rendezvous_port_count - 1 > 65535:
            raise SettingsError(f"rendezvous ports {self.rendezvous_port_first}+{self.rendezvous_port_count} "
                                "go past 65535")
        if self.scan_interval_seconds >= self.lease_seconds:
            raise SettingsError(
                f"scan interval {self.scan_interval_seconds:g}s must be shorter than the lease "
                f"{self.lease_seconds:g}s, or expired leases would be noticed a whole lease late"
            )
