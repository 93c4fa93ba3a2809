"""The follow-up page's figures, derived from the job as GET /v1/jobs/{id} shows it. Pure: dicts in, dicts out.

Where each number comes from (docs/panel.md says the same to the reader):
- consumed, ceiling, remaining, overshoot: the budget service's ledger (``job.budget``); the provisional part
  (``budget.provisional_seconds``, the running interval since the last usage sample) when the API gives it;
- the requeue minimum: consumed + 60 s, the queue's rule (DESIGN.md section 5), which the server still judges;
- the checkpoint cadence and ETA: ``job.checkpoint`` (the spec's cadence, the queue's measured step time);
- the interruption cost: ``job.interruption_cost`` from the API; on a gateway without it, estimated here as the
  steps since the last valid checkpoint times the measured step time times the devices held (marked estimate);
- ceiling history: ``budget.ceiling_history`` (each entry: the new total, who, when), with the value it replaced.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from libs.contracts.jobs import SPENDS_ATTEMPT

REQUEUE_MARGIN_SECONDS = 60.0  # the queue's rule: new ceiling >= consumed + 60 s (services/queue/domain)
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


def _num(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def devices(spec: Mapping[str, Any]) -> int:
    """Devices a run holds: workers x GPUs per worker, a CPU-only worker counted as one (DESIGN.md 11)."""
    workers = int(spec.get("workers") or 1)
    return workers * max(int(spec.get("gpus_per_worker") or 0), 1)


def budget(job: Mapping[str, Any]) -> dict[str, Any]:
    block = job.get("budget") or {}
    spec = job.get("spec") or {}
    ceiling = _num(block.get("ceiling_seconds")) or _num(spec.get("gpu_ceiling_seconds"))
    consumed = _num(block.get("consumed_seconds"))
    provisional = _num(block.get("provisional_seconds")) if job.get("state") == "running" else None
    total = (consumed or 0.0) + (provisional or 0.0)
    remaining = _num(block.get("remaining_seconds"))
    if remaining is None and ceiling is not None and consumed is not None:
        remaining = max(ceiling - total, 0.0)
    overshoot = _num(block.get("overshoot_seconds"))
    return {"ceiling": ceiling, "consumed": consumed, "provisional": provisional, "remaining": remaining,
            "overshoot": overshoot if overshoot and overshoot > 0 else None, "warning": block.get("warning")}


def requeue_minimum(consumed: float | None) -> float:
    return round((consumed or 0.0) + REQUEUE_MARGIN_SECONDS, 3)


def ceiling_history(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each change of the ceiling: when, who, from what (None for the first), to what; newest last."""
    entries = (job.get("budget") or {}).get("ceiling_history") or job.get("ceiling_history") or []
    out, previous = [], None
    for entry in entries:
        if not isinstance(entry, Mapping):
            continue
        value = _num(entry.get("ceiling_seconds"))
        out.append({"at": entry.get("at"), "actor": entry.get("actor"), "from": previous, "to": value})
        previous = value
    return out


def interruption_cost(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """What an interruption now would throw away (on an interrupted job: what was lost): ``{steps, gpu_seconds,
    since_step, estimated}``. The API's figure when it has one; else steps since the last valid checkpoint x the
    measured step time x the devices held. None before the first step."""
    given = job.get("interruption_cost")
    if isinstance(given, Mapping):
        return {"steps": given.get("steps"), "gpu_seconds": _num(given.get("gpu_seconds")),
                "since_step": given.get("since_step", given.get("checkpoint_step")), "estimated": False}
    last_step = job.get("last_step")
    if last_step is None or job.get("state") in TERMINAL:
        return None
    since = int(((job.get("last_checkpoint") or {}).get("step")) or 0)
    steps = max(int(last_step) - since, 0)
    step_seconds = _num(job.get("step_seconds"))
    gpu = None if step_seconds is None else round(steps * step_seconds * devices(job.get("spec") or {}), 3)
    return {"steps": steps, "gpu_seconds": gpu, "since_step": since, "estimated": True}


def first_checkpoint_warning(job: Mapping[str, Any]) -> dict[str, Any] | None:
    """The budget's warning that the first checkpoint cannot fit the ceiling: expected GPU-seconds vs ceiling."""
    warning = (job.get("budget") or {}).get("warning")
    if not isinstance(warning, Mapping):
        return None
    return {"expected": _num(warning.get("expected_seconds")), "ceiling": _num(warning.get("ceiling_seconds")),
            "source": warning.get("source")}


def attempts(job: Mapping[str, Any]) -> list[tuple[str, int]]:
    """Attempts by cause, every cause shown (counted or not), in the contract's order."""
    counts = job.get("attempts") or {}
    return [(cause, int(count or 0)) for cause, count in counts.items()] if isinstance(counts, Mapping) else []


def attempt_groups(job: Mapping[str, Any]) -> dict[str, Any]:
    """Attempts that count against the spec's ``max_attempts`` and interruptions that do not, shown apart
    (issue 26: "Attempt 4 / 3" compared every run with the limit): ``{spent, max, interruptions, counted,
    free}``, the last two as (cause, count) in the contract's order."""
    pairs = attempts(job)
    counted = [(cause, count) for cause, count in pairs if cause in SPENDS_ATTEMPT]
    free = [(cause, count) for cause, count in pairs if cause not in SPENDS_ATTEMPT]
    limit = (job.get("spec") or {}).get("max_attempts")
    return {"spent": sum(count for _, count in counted), "max": limit if isinstance(limit, int) else None,
            "interruptions": sum(count for _, count in free), "counted": counted, "free": free}


def gang_ranks(job: Mapping[str, Any], executors: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each rank of a gang with its executor, node and readiness (ready_at, or how it ended)."""
    nodes = {e.get("executor_id"): e.get("node_id") for e in executors}
    return [{"rank": rank, "executor_id": worker.get("executor_id"), "node_id": nodes.get(worker.get("executor_id")),
             "ready_at": worker.get("ready_at"), "ended": worker.get("ended")}
            for rank, worker in enumerate(job.get("gang") or []) if isinstance(worker, Mapping)]


def may_requeue(job: Mapping[str, Any]) -> bool:
    return job.get("state") == "interrupted"


def may_cancel(job: Mapping[str, Any], actor: str, *, manage: bool, submit: bool) -> bool:
    """The API's rule for cancel (routes/jobs.py): one's own job with finetune:submit, any with finetune:manage;
    a finished job has nothing to cancel."""
    if job.get("state") in TERMINAL:
        return False
    return manage or (submit and job.get("owner") == actor)
