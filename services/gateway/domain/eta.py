"""The time to a job's next checkpoint, and why it is unknown when it is: one rule for the API and the panel.

An ETA is (steps to the next checkpoint) x (measured step time). It means something only while the steps
advance: a job whose step stands still (the health service calls it ``stuck``, or cannot hear it:
``no_signal``, or its step has not moved for longer than two step times and the health service's silence
allowance) would keep announcing "in 5 s" for as long as it stays still, so then the ETA is unknown and says
so. A job that is not running has no checkpoint coming at all, whatever step time it measured before. Pure: the
job's fields and its health signal in, a number or a status out; no clock (the signal's detail carries its
ages, measured by the database).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# The health signals that say the step stands still or cannot be seen to move.
STANDING_SIGNALS = frozenset({"stuck", "no_signal"})


class EtaStatus(StrEnum):
    """Why ``next_eta_seconds`` is what it is."""

    ESTIMATED = "estimated"  # running, step time measured, steps advancing: the ETA is a number
    NOT_MEASURED = "not_measured"  # running, no step time measured yet
    STANDING = "standing"  # running, but the step stands still: no ETA until it moves again
    NOT_RUNNING = "not_running"  # no run in progress (queued, interrupted, ...): no checkpoint is coming
    NONE_DUE = "none_due"  # no checkpoint cadence, or every step is done


@dataclass(frozen=True)
class Eta:
    seconds: float | None
    status: EtaStatus


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def step_standing(signal: Mapping[str, Any] | None, step_seconds: float, lease_epoch: Any) -> bool:
    """Whether the health service's view of the job says its step stands still.

    ``signal`` is the job's signal block (signal, plus the detail's ``seconds_since_step_change``,
    ``no_signal_after_seconds`` and ``epoch``). Steps are seen at heartbeat granularity, so a step is standing
    only once it has not moved for longer than both two step times and the silence allowance (two heartbeats by
    default); a reading about an older run (another epoch) says nothing about this one.
    """
    if not signal:
        return False
    if signal.get("signal") in STANDING_SIGNALS:
        return True
    if signal.get("epoch") is not None and lease_epoch is not None and signal.get("epoch") != lease_epoch:
        return False
    still = _finite(signal.get("seconds_since_step_change"))
    allowance = _finite(signal.get("no_signal_after_seconds")) or 0.0
    return still is not None and still > max(2.0 * step_seconds, allowance)


def next_eta(*, state: Any, next_step: int | None, last_step: int | None, step_seconds: Any,
             signal: Mapping[str, Any] | None = None, lease_epoch: Any = None) -> Eta:
    """The seconds to checkpoint ``next_step`` and their status (EtaStatus, in the order checked)."""
    if next_step is None:
        return Eta(None, EtaStatus.NONE_DUE)
    if state != "running":
        return Eta(None, EtaStatus.NOT_RUNNING)
    per_step = _finite(step_seconds)
    if per_step is None or per_step < 0:
        return Eta(None, EtaStatus.NOT_MEASURED)
    if step_standing(signal, per_step, lease_epoch):
        return Eta(None, EtaStatus.STANDING)
    return Eta(round(max(next_step - (last_step or 0), 0) * per_step, 3), EtaStatus.ESTIMATED)
