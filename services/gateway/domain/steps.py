"""A job's step history as GET /v1/jobs/{id}/steps shows it: the accepted step reports (loss, mean step time)
downsampled to a bounded number of points for a loss curve and a step-time plot. Pure: rows in, points out.

Rows come in order (run by run, step by step). Downsampling keeps consecutive reports together in buckets of
equal size that never span two runs (a resumed run repeats steps from its checkpoint): each point is the last
step of its bucket with the mean of its finite losses and of its step times, so the shape survives and no point
mixes two runs. At most ``max_points`` points, whatever the number of reports.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

MAX_POINTS = 2000
DEFAULT_POINTS = 500


def _mean(values: list[Any]) -> float | None:
    finite = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def _point(bucket: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    last = bucket[-1]
    return {"epoch": last.get("epoch"), "step": last.get("step"), "time": last.get("time"),
            "loss": _mean([r.get("loss") for r in bucket]),
            "step_seconds": _mean([r.get("step_seconds") for r in bucket]),
            "metrics": last.get("metrics") or {}, "reports": len(bucket)}


def downsample(rows: Sequence[Mapping[str, Any]], max_points: int) -> list[dict[str, Any]]:
    """At most ``max_points`` points (>= 1) from ``rows`` ordered by run and step; each run keeps at least
    its last point while there are fewer runs than points."""
    if not rows:
        return []
    runs = len({r.get("epoch") for r in rows})
    size = max(1, math.ceil(len(rows) / max(max_points - runs, 1))) if len(rows) > max_points else 1
    points: list[dict[str, Any]] = []
    bucket: list[Mapping[str, Any]] = []
    for row in rows:
        if bucket and (len(bucket) >= size or row.get("epoch") != bucket[-1].get("epoch")):
            points.append(_point(bucket))
            bucket = []
        bucket.append(row)
    points.append(_point(bucket))
    return points[-max_points:]  # only with more runs than points: the latest runs are kept


def steps_view(job_id: str, rows: Sequence[Mapping[str, Any]], max_points: int) -> dict[str, Any]:
    points = downsample(rows, max_points)
    return {"job_id": job_id, "reports": len(rows), "downsampled": len(points) < len(rows), "points": points}
