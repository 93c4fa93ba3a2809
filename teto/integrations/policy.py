"""What the training-stack callbacks decide, as pure functions (``transformers.py`` and ``lightning.py`` call them).

A callback sees every optimizer step; what it tells Teto is decided here, from numbers it passes in, never from a
clock or a library object of its own: when a step report is due (at the progress interval, never more often,
the first and last step always), what a report carries (the mean step time since the last one, the newest
loss and learning rate not yet reported), what a stop
request turns into (save a fresh checkpoint, then end training), whether a saved checkpoint is reported (rank 0,
once per step), where checkpoints go under Teto, and which checkpoint a run resumes from.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROGRESS_ENV = "TETO_PROGRESS_INTERVAL"  # seconds between the step reports the agent forwards (launch.py)
DEFAULT_INTERVAL = 1.0  # outside Teto, or an agent that does not say: reports then cost nothing anyway
LOSS_KEYS = ("loss", "train_loss", "train/loss")
LR_KEYS = ("learning_rate", "lr", "lr-AdamW", "train/learning_rate")


def progress_interval(env: Mapping[str, str]) -> float:
    """The agent's progress interval from the run's environment; a missing or malformed value reads as 1 s."""
    try:
        value = float(env.get(PROGRESS_ENV, ""))
    except ValueError:
        return DEFAULT_INTERVAL
    return value if math.isfinite(value) and value > 0 else DEFAULT_INTERVAL


@dataclass
class Pace:
    """The steps a callback has timed since its last step report, and when that report was made (monotonic s)."""

    reported_at: float | None = None
    seconds_sum: float = 0.0
    seconds_n: int = 0
    loss: float | None = None  # the newest loss logged since the last report
    learning_rate: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def number(value: Any) -> float | None:
    """A finite float from a logged value (a tensor's ``item()`` already taken), else None."""
    if isinstance(value, bool):
        return None
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def note_step(pace: Pace, seconds: float | None) -> None:
    """One optimizer step ended, ``seconds`` after it began (None: not timed, e.g. the first after a resume)."""
    if seconds is not None and seconds >= 0:
        pace.seconds_sum += seconds
        pace.seconds_n += 1


def note_logs(pace: Pace, logs: Mapping[str, Any]) -> bool:
    """Keep what a logging call carries (loss, learning rate, other numbers); True when it carried a loss."""
    loss = next((n for k in LOSS_KEYS if (n := number(logs.get(k))) is not None), None)
    lr = next((n for k in LR_KEYS if (n := number(logs.get(k))) is not None), None)
    if lr is not None:
        pace.learning_rate = lr
    for key, value in logs.items():
        if key in LOSS_KEYS or key in LR_KEYS or not isinstance(key, str):
            continue
        if (n := number(value)) is not None:
            pace.metrics[key] = n
    if loss is not None:
        pace.loss = loss
        return True
    return False


def report_due(pace: Pace, now: float, interval: float, *, step: int, max_steps: int | None,
               final: bool = False) -> bool:
    """Whether the step that just ended is reported: the first, the last (``step == max_steps``, or ``final``: the
    step a stop ends the run at, whose checkpoint must not be ahead of the job's step), or the first after
    ``interval`` seconds since the last report; never two within an interval otherwise."""
    if pace.reported_at is None or final:
        return True
    if max_steps is not None and max_steps > 0 and step >= max_steps:
        return True
    return now - pace.reported_at >= interval


@dataclass(frozen=True)
class StepReport:
    """What ``teto.sdk.report_step`` is called with."""

    step: int
    total_steps: int | None
    loss: float | None
    step_seconds: float | None
    metrics: dict[str, float]


def take_report(pace: Pace, now: float, *, step: int, max_steps: int | None) -> StepReport:
    """The report for ``step`` (the mean step time of the steps timed since the last one; the loss logged since,
    if any: a loss is reported once, so a curve never repeats a point), and the pace started afresh."""
    metrics = dict(pace.metrics)
    if pace.learning_rate is not None:
        metrics["learning_rate"] = pace.learning_rate
    report = StepReport(step=step, total_steps=max_steps if max_steps and max_steps > 0 else None, loss=pace.loss,
                        step_seconds=pace.seconds_sum / pace.seconds_n if pace.seconds_n else None, metrics=metrics)
    pace.reported_at, pace.seconds_sum, pace.seconds_n, pace.loss = now, 0.0, 0, None
    pace.metrics = {}
    return report


def cadence_due(step: int, every: int | None, *, saved: set[int]) -> bool:
    """A callback that writes the job's checkpoints itself (Lightning's) saves after every ``every`` steps (the
    job's ``checkpoint_every_steps``), once per step."""
    return every is not None and every > 0 and step > 0 and step % every == 0 and step not in saved


@dataclass(frozen=True)
class StopDecision:
    """What a callback does once a stop was requested: save first (a ceiling asks for a checkpoint; a cancel need
    not), then end training. Neither when no stop was requested."""

    save: bool
    stop: bool


def on_stop(requested: bool, *, checkpoint_first: bool, saved_this_step: bool) -> StopDecision:
    """A stop request seen at the end of a step. The run ends on a fresh checkpoint when the stop asks for one
    (``checkpoint_first``), unless this very step is already being saved; a stop that asks for none ends at once,
    within the grace, without spending it on writing."""
    if not requested:
        return StopDecision(save=False, stop=False)
    return StopDecision(save=checkpoint_first and not saved_this_step, stop=True)


def report_checkpoint_due(step: int, *, is_writer: bool, reported: set[int]) -> bool:
    """A saved checkpoint is reported by rank 0 only (the other ranks' copies are never the job's) and once per
    step (a save the cadence and the script both asked for is one checkpoint)."""
    return is_writer and step not in reported


def checkpoint_root(*, in_teto: bool, rank: int, checkpoint_dir: Path, work_dir: Path | None,
                    user_dir: str | os.PathLike[str] | None) -> Path | None:
    """Where the stack writes checkpoints under Teto: rank 0 in the job's checkpoint directory (the only place the
    agent accepts, keeps and resumes from); another rank, whose stack may still write its own part (an RNG state),
    in its own work directory. None outside Teto: the script's own choice stands."""
    if not in_teto:
        return None
    if rank == 0:
        return checkpoint_dir
    base = work_dir if work_dir is not None else Path(user_dir or "checkpoints")
    return base / f"rank-{rank}-checkpoints"


def resume_path(resumed: tuple[int, Path] | None) -> str | None:
    """What ``trainer.train(resume_from_checkpoint=...)`` / ``trainer.fit(ckpt_path=...)`` take: the checkpoint the
    agent chose (``teto.sdk.resume_checkpoint()``), or None to start fresh."""
    return None if resumed is None else str(resumed[1])


def stop_agreed(flags: list[bool]) -> bool:
    """A gang stops together: any worker asked to stop stops every worker at the same step (the others would
    wait in their next collective for a peer that left)."""
    return any(flags)


def beats_stopped(before: list[int], after: list[int]) -> bool:
    """Whether any peer's alive count (read from the gang's store some beats apart) did not move: that peer is gone.
    Counts that cannot be paired (a peer missing from one read) read as gone."""
    return len(before) != len(after) or any(a <= b for b, a in zip(before, after, strict=True))
