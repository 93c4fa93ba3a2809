"""Settings of the health service (``TETO_*`` environment variables)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from pydantic import Field

from libs.runtime.settings import CommonSettings, SettingsError, batch_linger_field

from .domain.breaker import Policy
from .domain.liveness import SampleRule
from .domain.signals import Thresholds


class HealthSettings(CommonSettings):
    batch_linger_seconds: float = batch_linger_field("health's consumer of job events (not of heartbeats)")
    signal_timeout_seconds: float | None = Field(
        None, gt=0, le=86400, description="Silence after which an executor is no_signal (default: 2 heartbeats)"
    )
    stuck_after_seconds: float = Field(
        120.0, gt=0, le=7 * 86400, description="A training step standing still this long is stuck (at least 2 "
        "progress intervals, whatever this says)"
    )
    evaluate_interval_seconds: float = Field(1.0, gt=0, le=60, description="How often signals are re-derived at "
                                             "the latest (each stored batch of heartbeats also starts a pass)")
    max_reboots: int = Field(2, ge=0, le=100, description="Failed recoveries (reboots) before a node is replaced")
    min_ratio: float = Field(0.75, gt=0, le=1, description="A node's throughput figure below this fraction of "
                             "the group's healthy median (or the baseline) fails the test")
    check_baselines: str = Field("{}", max_length=10000, description='JSON {"<test>.<figure>": value}, e.g. '
                                 '{"matmul.tflops_bfloat16": 700}: used instead of the group median')
    join_batch_seconds: float = Field(5.0, ge=0, le=3600, description="Joining nodes wait this long so nodes "
                                      "joining together are checked (and all-reduce) together")
    check_interval_seconds: float = Field(0.5, gt=0, le=60, description="How often due checks are started")
    check_deadline_seconds: float = Field(
        900.0, gt=0, le=86400, description="A node whose check report has not arrived this long after its "
        "directive (the agent died, or its report was refused) fails the run with that reason. Keep it above the "
        "agents' check_timeout_seconds, which ends a hung suite on the node itself")
    node_gone_seconds: float = Field(
        300.0, gt=0, le=7 * 86400, description="A node whose agent has been silent this long (no heartbeat, no "
        "registration: dead, frozen, powered off, or a bare registration) is marked gone: never schedulable, never "
        "a peer; registering again brings it back")
    median_max_age_seconds: float = Field(
        7 * 86400.0, gt=0, le=365 * 86400, description="A ready node's figures take part in its group's median "
        "only if it passed a check this recently (and is alive now, under the same suite version)")
    replacement_budget: int = Field(3, ge=0, le=1000, description="Replacements per group and window; one more "
                                    "due raises the group's systemic-failure alert instead (0: never replace)")
    replacement_window_seconds: float = Field(3600.0, gt=0, le=30 * 86400, description="The window of the "
                                              "replacement budget and of the same-test-again verdict")
    provisioner_command: str | None = Field(
        None, max_length=4000, description="Run when a node is replaced; {node_id} {group} {executor_id} are "
        "filled in")
    provisioner_url: str | None = Field(None, max_length=2000, description="POSTed the replaced node as JSON "
                                        "(when no provisioner command is set)")
    slurm_pilot_dir: Path | None = Field(
        None, description="The pilot directory of `teto slurm provision`: set, Teto's verdicts on pilots' nodes act "
        "on Slurm (a failed node drained with its reason, a passing one resumed if Teto drained it, a replaced "
        "one's pilot ended and a new pilot submitted on another node); Slurm's commands run with this service's "
        "environment (SLURM_CONF)")
    slurm_reboot: bool = Field(
        False, description="A reboot directive to a pilot's node also asks Slurm to reboot it once idle (scontrol "
        "reboot ASAP nextstate=DOWN; a pass before that cancels it): only where the site lets Teto reboot nodes "
        "(RebootProgram set)")

    @property
    def breaker(self) -> Policy:
        return Policy(self.replacement_budget, timedelta(seconds=self.replacement_window_seconds))

    @property
    def baselines(self) -> dict[str, float]:
        return {k: float(v) for k, v in json.loads(self.check_baselines).items()}

    @property
    def effective_signal_timeout(self) -> float:
        return self.signal_timeout_seconds if self.signal_timeout_seconds is not None else 2 * self.heartbeat_seconds

    def sample_rule(self, suite_version: str | None) -> SampleRule:
        return SampleRule(timedelta(seconds=self.effective_signal_timeout),
                          timedelta(seconds=self.median_max_age_seconds), suite_version)

    @property
    def thresholds(self) -> Thresholds:
        return Thresholds(self.effective_signal_timeout, self.stuck_after_seconds)

    def check(self) -> None:
        super().check()
        try:
            self.baselines
        except (ValueError, TypeError, AttributeError) as exc:
            raise SettingsError(f"TETO_CHECK_BASELINES must be a JSON object of numbers: {exc}") from None
        if self.node_gone_seconds < 2 * self.heartbeat_seconds:
            raise SettingsError(f"TETO_NODE_GONE_SECONDS {self.node_gone_seconds:g}s is under two heartbeats "
                                f"({2 * self.heartbeat_seconds:g}s): a healthy new node would be marked gone")
        if self.effective_signal_timeout < self.heartbeat_seconds:
            raise SettingsError(
                f"signal timeout {self.effective_signal_timeout:g}s is shorter than one heartbeat "
                f"({self.heartbeat_seconds:g}s): every healthy executor would flap to no_signal"
            )
