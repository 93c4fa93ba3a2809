"""GPU-second arithmetic, the ceiling and its exhaustion, the requeue rule and the checkpoint forecast.

GPU-seconds are devices held x wall seconds per usage sample; a CPU-only worker counts as one device. The
ledger is append-only, totals only grow. Exhaustion is announced once per ceiling value: a requeue sets a new
ceiling, which may be announced again when it is reached in turn.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

# A requeue must leave at least this much of the new ceiling unspent (DESIGN section 5).
REQUEUE_MARGIN_SECONDS = 60.0


def devices_held(devices: int) -> int:
    """A CPU-only worker (0 GPUs) still holds a machine: it counts as one device."""
    return max(1, devices)


def gpu_seconds(devices: int, wall_seconds: float) -> float:
    return devices_held(devices) * max(0.0, wall_seconds)


def gang_devices(workers: int, gpus_per_worker: int) -> int:
    return max(1, workers) * devices_held(gpus_per_worker)


def starts_run(state: str, previous_state: str | None) -> bool:
    """Whether a job event moves the job into ``running`` (a grant, or a gang's admission): the start of the
    stretch the gateway shows as provisional consumption until the run's first usage sample arrives."""
    return state == "running" and previous_state != "running"


@dataclass(frozen=True)
class Account:
    """One job's budget as the ledger and the job's events describe it."""

    ceiling: float | None  # None until the job's submission is known
    consumed: float = 0.0
    exhausted_for: float | None = None  # the ceiling whose exhaustion was announced
    overshoot: float = 0.0  # the largest consumption past any ceiling the job had
    active: bool = True  # False once the job is terminal: nothing to stop any more


@dataclass(frozen=True)
class Decision:
    account: Account
    exhausted: bool  # announce budget.exhausted now


def _decide(account: Account) -> Decision:
    """The overshoot and the announcement an account's figures call for (one new Account at most: this runs for
    every job of every usage batch)."""
    ceiling = account.ceiling
    if ceiling is None:
        return Decision(account, False)
    announce = account.consumed >= ceiling and account.active and account.exhausted_for != ceiling
    return Decision(Account(ceiling, account.consumed, ceiling if announce else account.exhausted_for,
                            max(account.overshoot, account.consumed - ceiling), account.active), announce)


def on_usage(account: Account, added_seconds: float) -> Decision:
    """New ledger rows for the job: the total grows; reaching the ceiling is announced once per ceiling."""
    return _decide(Account(account.ceiling, account.consumed + max(0.0, added_seconds), account.exhausted_for,
                           account.overshoot, account.active))


def on_ceiling(account: Account, ceiling: float) -> Decision:
    """The job's ceiling was set (submission) or replaced (requeue)."""
    return _decide(replace(account, ceiling=ceiling))


def on_terminal(account: Account) -> Account:
    return replace(account, active=False)


@dataclass(frozen=True)
class CeilingCheck:
    ok: bool
    consumed: float
    minimum: float
    given: float

    @property
    def reason(self) -> str | None:
        if self.ok:
            return None
        return (f"new ceiling {self.given:g}s is below consumed {self.consumed:g}s + {REQUEUE_MARGIN_SECONDS:g}s "
                f"= {self.minimum:g}s")

    def detail(self) -> dict[str, float]:
        return {"consumed_seconds": self.consumed, "minimum_seconds": self.minimum, "given_seconds": self.given}


def check_new_ceiling(consumed: float, new: float) -> CeilingCheck:
    """A requeue's new TOTAL ceiling is accepted only if ``new >= consumed + 60``."""
    minimum = consumed + REQUEUE_MARGIN_SECONDS
    return CeilingCheck(ok=new >= minimum, consumed=consumed, minimum=minimum, given=new)


@dataclass(frozen=True)
class StepStats:
    """Measured step time: a mean weighted by the steps each report covers."""

    last_step: int | None = None
    mean_step_seconds: float | None = None
    measured_steps: int = 0


def on_step(stats: StepStats, step: int, step_seconds: float | None) -> StepStats:
    if step_seconds is None:
        return replace(stats, last_step=step)
    # A report covers the steps since the previous one; after a resume the step may go back: count one.
    covered = step - stats.last_step if stats.last_step is not None and step > stats.last_step else 1
    total = stats.measured_steps + covered
    previous = (stats.mean_step_seconds or 0.0) * stats.measured_steps
    return StepStats(last_step=step, mean_step_seconds=(previous + step_seconds * covered) / total,
                     measured_steps=total)


def next_checkpoint_eta(step: int | None, every_steps: int, mean_step_seconds: float | None) -> float | None:
    """Seconds to the next checkpoint: remaining steps to the next multiple of ``every_steps`` x mean step
    time; None until a step time has been measured."""
    if mean_step_seconds is None or step is None or every_steps < 1:
        return None
    return (every_steps - step % every_steps) * mean_step_seconds


@dataclass(frozen=True)
class FirstCheckpointWarning:
    expected_seconds: float  # GPU-seconds expected to reach the first checkpoint
    ceiling_seconds: float
    step_seconds: float
    every_steps: int
    devices: int
    source: str  # "estimate" (the user's, at submit) or "measured"

    @property
    def reason(self) -> str:
        return (f"the first checkpoint is expected after {self.expected_seconds:g} GPU-seconds "
                f"({self.every_steps} steps x {self.step_seconds:g}s x {self.devices} devices), more than the "
                f"ceiling of {self.ceiling_seconds:g} GPU-seconds: the job may stop before it can be resumed")

    def as_dict(self) -> dict[str, Any]:
        return {"expected_seconds": self.expected_seconds, "ceiling_seconds": self.ceiling_seconds,
                "step_seconds": self.step_seconds, "every_steps": self.every_steps, "devices": self.devices,
                "source": self.source, "reason": self.reason}


def first_checkpoint_warning(every_steps: int, step_seconds: float | None, devices: int, ceiling: float | None,
                             source: str) -> FirstCheckpointWarning | None:
    """Warn when reaching the first checkpoint is expected to cost more than the whole ceiling."""
    if step_seconds is None or ceiling is None:
        return None
    expected = every_steps * step_seconds * devices_held(devices)
    if expected <= ceiling:
        return None
    return FirstCheckpointWarning(expected, ceiling, step_seconds, every_steps, devices_held(devices), source)
