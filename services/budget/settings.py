"""Settings of the budget service (``TETO_*`` environment variables)."""

from __future__ import annotations

from pydantic import Field

from libs.runtime.settings import CommonSettings, batch_linger_field


class BudgetSettings(CommonSettings):
    usage_batch_size: int = Field(500, ge=1, le=5000, description="Heartbeats per ledger transaction at most")
    batch_linger_seconds: float = batch_linger_field("the budget's consumers of job events and step reports (not "
                                                     "of usage)")
    usage_clock_slack_seconds: float = Field(
        30.0, ge=0, le=3600, description="Wall seconds a run's usage may exceed the time since its lease grant "
        "(the queue's and the budget's clocks differ a little); beyond it a record is refused, never charged")
    rpc_queue_group: str = Field("budget", pattern=r"^[A-Za-z0-9_-]+$",
                                 description="NATS queue group of the status responders (one answers)")
