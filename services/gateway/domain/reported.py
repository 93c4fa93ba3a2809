"""What a job's runs reported, as the job view shows it (issue 27): the latest step report with its loss and
learning rate, and each checkpoint accepted with its kind (a file or a directory), size and files. Pure: rows in,
dicts out.

The learning rate is a step metric: ``learning_rate`` (what Hugging Face's Trainer logs and Teto's callbacks
report), else ``lr``, else the first ``lr-*``/``lr_*`` metric (Lightning's LearningRateMonitor names it after the
optimizer, ``lr-AdamW``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

CHECKPOINTS_SHOWN = 20


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def learning_rate(metrics: Mapping[str, Any] | None) -> float | None:
    """The learning rate among a step report's metrics (see the module's docstring); None when none is there."""
    if not isinstance(metrics, Mapping):
        return None
    for key in ("learning_rate", "lr"):
        if (value := _finite(metrics.get(key))) is not None:
            return value
    for key in sorted(metrics):
        if key.startswith(("lr-", "lr_")) and (value := _finite(metrics[key])) is not None:
            return value
    return None


def latest_report(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The latest accepted step report: ``{step, epoch, loss, learning_rate, step_seconds, metrics, time}``;
    None before the first."""
    if row is None:
        return None
    metrics = row.get("metrics") if isinstance(row.get("metrics"), Mapping) else {}
    return {"step": row.get("step"), "epoch": row.get("epoch"), "loss": _finite(row.get("loss")),
            "learning_rate": learning_rate(metrics), "step_seconds": _finite(row.get("step_seconds")),
            "metrics": dict(metrics), "time": row.get("time")}


def checkpoints(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each checkpoint the queue accepted (its ``checkpointed`` events), newest first: ``{step, epoch, kind, bytes,
    files, path, time}``; a checkpoint reported before kinds were recorded is a file."""
    out = []
    for event in events:
        if event.get("event") != "checkpointed":
            continue
        detail = event.get("detail") if isinstance(event.get("detail"), Mapping) else {}
        kind = detail.get("kind") if detail.get("kind") in ("file", "directory") else "file"
        out.append({"step": detail.get("step"), "epoch": event.get("epoch", detail.get("epoch")), "kind": kind,
                    "bytes": detail.get("bytes"), "files": detail.get("files", 1 if kind == "file" else None),
                    "path": detail.get("path"), "time": event.get("time") or detail.get("at")})
    return sorted(out, key=lambda c: (c["epoch"] or 0, c["step"] or 0), reverse=True)
