"""Step reports held back in the training process (used by ``sdk.py``): at most one line on the report pipe per
``EVERY`` seconds, instead of one per step.

Each line written wakes the agent (a read, a JSON decode, its throttle) and costs the training thread a write
that may hand the core to the agent; the agent forwards at most one step report per progress interval anyway
(``reports.py``). So a step is written at once when it is the first, the last (``step == total_steps``), or the
first after ``EVERY`` seconds without a write; otherwise it is held, replacing the step held before it, and a
timer thread writes it when its interval ends, so a script that reports and then hangs still shows its latest
step. A record that stands for several timed steps carries their mean ``step_seconds`` and their number in
``step_seconds_n`` (absent when it is one), so the agent's mean weighs every step. Anything else the process
reports (a checkpoint, a phase) writes the held step first: a checkpoint is never reported before its step.

The rules are pure functions on ``Held``; ``sdk.py`` calls them under its write lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EVERY = 0.25  # seconds: the most lines per second a training process writes for its steps (4)


@dataclass
class Held:
    """The step held back (the latest), the step times it stands for, and when a step was last written."""

    record: dict[str, Any] | None = None
    seconds_sum: float = 0.0
    seconds_n: int = 0
    written_at: float | None = None


def hold(held: Held, record: dict[str, Any], now: float, every: float = EVERY) -> dict[str, Any] | None:
    """Take a step record: the record to write now (for it and the steps held before it), or None (held)."""
    seconds = record.get("step_seconds")
    if isinstance(seconds, int | float):
        held.seconds_sum += float(seconds)
        held.seconds_n += 1
    held.record = record
    last = record.get("total_steps") is not None and record.get("step") == record.get("total_steps")
    if held.written_at is None or now - held.written_at >= every or last:
        return take(held, now)
    return None


def take(held: Held, now: float) -> dict[str, Any] | None:
    """The held record to write now, standing for every step held since the last write (None: nothing held)."""
    record = held.record
    if record is None:
        return None
    out = {**record, "step_seconds": held.seconds_sum / held.seconds_n if held.seconds_n else None}
    if held.seconds_n > 1:
        out["step_seconds_n"] = held.seconds_n
    held.record, held.seconds_sum, held.seconds_n, held.written_at = None, 0.0, 0, now
    return out


def due(held: Held, now: float, every: float = EVERY) -> bool:
    """Whether the timer should write the held step now (its interval since the last write has ended)."""
    return held.record is not None and (held.written_at is None or now - held.written_at >= every)
