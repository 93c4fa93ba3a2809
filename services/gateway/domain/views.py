"""How the gateway shows a job: the queue's row, the health signal, the budget and the checkpoint cadence,
merged into one JSON shape. Pure: rows in (as dicts), a dict out; the clock is not read here."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from libs.contracts.jobs import AttemptCause
from libs.contracts.policies import GangPolicy

from . import departures, eta, live

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
# States in which the queue has granted a job to executors (its rank 0 in executor_id, every rank in gang).
GRANTED = frozenset({"running", "admitting"})

JOB_FIELDS = ("id", "name", "owner", "state", "spec", "attempts", "attempt_number", "executor_id", "lease_epoch",
              "lease_expires_at", "last_step", "total_steps", "step_seconds", "last_checkpoint", "reason", "error",
              "ceiling_history", "created_at", "updated_at", "gang", "rendezvous", "ready_deadline", "backoff_count",
              "next_admission_at", "org", "project", "priority", "node_group", "devices", "waiting")
BUDGET_FIELDS = ("ceiling_seconds", "consumed_seconds", "remaining_seconds", "overshoot_seconds", "warning",
                 "ceiling_history")
EVENT_FIELDS = ("job_id", "seq", "event", "state", "previous_state", "reason", "epoch", "executor_id", "detail",
                "time")
EXECUTOR_FIELDS = ("executor_id", "node_id", "group_name", "gpus", "accepting", "phase", "step", "job_id", "epoch",
                   "last_heartbeat", "signal", "signal_since", "detail")


def gang_policy_view(row: Mapping[str, Any] | None) -> dict[str, Any]:
    """The gang policy as GET /v1/policies/gang shows it: its fields, who set it and when (null: defaults)."""
    fields = GangPolicy.model_fields
    policy = GangPolicy() if row is None else GangPolicy.model_validate({f: row[f] for f in fields})
    return {**policy.model_dump(mode="json"), "updated_by": row and row.get("updated_by"),
            "updated_at": row and row.get("updated_at")}


def pick(row: Mapping[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """The named columns of a row; a column a view does not (yet) have is shown as null, not an error."""
    return {f: row.get(f) for f in fields}


def grants_by_executor(jobs: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Which job the queue has granted each executor, from the queue's job rows: ``{executor_id: {job_id,
    epoch}}``. Every rank of a gang whose process has not ended holds its job; a job outside running/admitting
    holds none (its ``executor_id`` names the last run's rank 0 only as history)."""
    grants: dict[str, dict[str, Any]] = {}
    for job in jobs:
        if job.get("state") not in GRANTED:
            continue
        grant = {"job_id": job.get("id"), "epoch": job.get("lease_epoch")}
        gang = job.get("gang") or []
        holders = [w.get("executor_id") for w in gang if isinstance(w, Mapping) and w.get("ended") is None]
        if not gang and job.get("executor_id"):
            holders = [job["executor_id"]]
        for executor_id in holders:
            if executor_id:
                grants[executor_id] = grant
    return grants


def run_ended(row: Mapping[str, Any], grant: Mapping[str, Any] | None, queue_run: Mapping[str, Any] | None) -> bool:
    """Whether the run a heartbeat-fed row names (its ``job_id`` and ``epoch``) is over by what the queue knows:
    no grant holds it and the queue's own row for the executor (``queue_run``: its ``job_id`` and ``epoch``,
    cleared by the executor's end report, executors.free_ended, or moved on by a newer heartbeat) names another
    run or none. A run still stopping (its job cancelled or preempted, the process not ended yet) is still named
    by the queue's row, and an executor the queue has no row for yet is taken as its heartbeat says."""
    if not row.get("job_id") or (grant is not None and grant.get("job_id")) or queue_run is None:
        return False
    return (queue_run.get("job_id"), queue_run.get("epoch")) != (row.get("job_id"), row.get("epoch"))


def executor_view(row: Mapping[str, Any], *, stale_reports: Mapping[str, int],
                  stale_heartbeats: Mapping[str, int],
                  grant: Mapping[str, Any] | None = None,
                  queue_run: Mapping[str, Any] | None = None,
                  job: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An executor as GET /v1/executors shows it; ``stale_*`` count what it sent under a lease it had lost
    (reports and renewals ignored by the queue, heartbeats ignored by health): non-zero marks a zombie.

    ``grant`` is the job the queue granted it (grants_by_executor). The grant is shown at once: the job list
    reads the same queue row, so a job naming an executor and that executor naming the job agree at every
    moment, not one heartbeat later. Until a heartbeat about that job and epoch arrives the executor is
    ``starting`` with no step (``job_source: "grant"``); once one has, the heartbeat's phase and step stand
    (``job_source: "heartbeat"``). Without a grant, what the heartbeat said is shown as it is, unless the run it
    names has ended (``run_ended``: the executor reported its end, up to a heartbeat interval before its next
    heartbeat says so): then it is idle with no job (``job_source: "report"``), as placement already counts it.
    ``job``: the queue's row of the job the heartbeat names; when that job has left the executor (a frozen agent
    whose job runs elsewhere: departures.job_left) the row names no job and no phase (``job_source: "left"``)
    and says what left in ``left_job``. ``zombie``: stale messages while it still names that run."""
    out = pick(row, EXECUTOR_FIELDS)
    out["job_source"] = "heartbeat" if out.get("job_id") else None
    if run_ended(row, grant, queue_run):
        out.update(job_id=None, epoch=None, phase="idle", step=None, job_source="report")
    if grant is not None and grant.get("job_id"):
        reported = (out.get("job_id"), out.get("epoch")) == (grant["job_id"], grant.get("epoch"))
        if not reported:
            out.update(job_id=grant["job_id"], epoch=grant.get("epoch"), phase="starting", step=None,
                       job_source="grant")
    left = departures.job_left(row, job) if out["job_source"] == "heartbeat" else None
    if left is not None:
        out.update(job_id=None, epoch=None, phase=None, step=None, job_source="left")
    out["left_job"] = left
    out["stale_reports"] = int(stale_reports.get(row.get("executor_id"), 0))
    out["stale_heartbeats"] = int(stale_heartbeats.get(row.get("executor_id"), 0))
    out["zombie"] = departures.is_zombie(out)
    return out


def node_view(row: Mapping[str, Any], grant: Mapping[str, Any] | None,
              queue_run: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A node as GET /v1/nodes shows it: its executor's job is the queue's grant from the moment of the grant,
    and none once that run has ended (``queue_run``, as in executor_view), so the node, its executor and the job
    agree."""
    out = dict(row)
    if grant is not None and grant.get("job_id"):
        out["job_id"] = grant["job_id"]
    elif queue_run is not None and out.get("job_id") and queue_run.get("job_id") != out["job_id"]:
        out["job_id"] = None
    return out


def next_checkpoint_step(every: int, last_step: int | None, total_steps: int | None) -> int | None:
    """The step at which the next checkpoint is due: the next multiple of ``every`` after the current step,
    or the final step when that comes first (a finished run checkpoints its last step)."""
    if every < 1:
        return None
    done = last_step or 0
    nxt = (done // every + 1) * every
    if total_steps is not None:
        if done >= total_steps:
            return None
        nxt = min(nxt, total_steps)
    return nxt


def checkpoint_block(spec: Mapping[str, Any], job: Mapping[str, Any], signal: Mapping[str, Any] | None = None,
                     measured_eta: Any = None) -> dict[str, Any]:
    """{every_steps, last_step, next_step, next_eta_seconds, next_eta_status}: the ETA is a number only while
    the job runs, its step time is measured and its step advances (eta.next_eta); ``next_eta_status`` says why
    it is null otherwise. ``measured_eta``: the budget service's ETA, taken while the queue has no step time."""
    every = int(spec.get("checkpoint_every_steps") or 0)
    last_ckpt = job.get("last_checkpoint") or {}
    nxt = next_checkpoint_step(every, job.get("last_step"), job.get("total_steps"))
    got = eta.next_eta(state=job.get("state"), next_step=nxt, last_step=job.get("last_step"),
                       step_seconds=job.get("step_seconds"), signal=signal, lease_epoch=job.get("lease_epoch"))
    if (got.status is eta.EtaStatus.NOT_MEASURED and isinstance(measured_eta, int | float)
            and math.isfinite(measured_eta)):
        standing = eta.step_standing(signal, 0.0, job.get("lease_epoch"))
        got = eta.Eta(None, eta.EtaStatus.STANDING) if standing else eta.Eta(measured_eta, eta.EtaStatus.ESTIMATED)
    return {"every_steps": every or None, "last_step": last_ckpt.get("step"), "next_step": nxt,
            "next_eta_seconds": got.seconds, "next_eta_status": str(got.status),
            "last_kind": (last_ckpt.get("kind") or "file") if last_ckpt.get("step") is not None else None,
            "last_bytes": last_ckpt.get("bytes")}


def signal_block(job_state: str, row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The health signal of a job; terminal jobs carry none whatever the health view still holds."""
    if row is None or job_state in TERMINAL or row.get("signal") is None:
        return None
    block = {"signal": row.get("signal"), "signal_since": row.get("signal_since"),
             "executor_id": row.get("executor_id")}
    detail = row.get("detail") or {}
    if isinstance(detail, Mapping):
        block.update({k: v for k, v in detail.items() if k not in block})
    return block


def budget_block(row: Mapping[str, Any] | None, job: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The budget service's account of the job. The queue decides ceilings (submit, requeue) and the budget
    service learns them from the job's events a moment later: while its ceiling history is behind the queue's,
    the queue's current ceiling is shown (and the remaining seconds follow), so an accepted requeue is visible
    in its own answer. Consumption is only ever the budget service's."""
    if row is None:
        return None
    block = pick(row, BUDGET_FIELDS)
    job = job or {}
    spec = job.get("spec") if isinstance(job.get("spec"), Mapping) else {}
    current = spec.get("gpu_ceiling_seconds")
    decided = list(job.get("ceiling_history") or [])
    known = list(block.get("ceiling_history") or [])
    if current is None or len(known) >= len(decided):
        return block
    block.update(ceiling_seconds=current, ceiling_history=known + decided[len(known):])
    if block.get("consumed_seconds") is not None:
        block["remaining_seconds"] = max(float(current) - float(block["consumed_seconds"]), 0.0)
    return block


def with_previous(history: Any) -> Any:
    """Ceiling history entries, each with the ceiling it replaced (``previous_ceiling_seconds``; null for the
    submit's): who raised it, when, from what to what."""
    if not isinstance(history, list):
        return history
    out, previous = [], None
    for entry in history:
        if isinstance(entry, Mapping):
            out.append({**entry, "previous_ceiling_seconds": previous})
            previous = entry.get("ceiling_seconds")
        else:
            out.append(entry)
    return out


def job_view(job: Mapping[str, Any], *, signal: Mapping[str, Any] | None = None,
             budget: Mapping[str, Any] | None = None,
             events: list[Mapping[str, Any]] | None = None,
             usage: list[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The job as GET /v1/jobs/{id} shows it; ``events`` is None in list responses (kept short). ``usage`` (the
    usage records of the job's current run) gives the single-job view its ``interruption_cost``."""
    out = pick(job, JOB_FIELDS)
    if isinstance(out.get("attempts"), Mapping):
        # Every cause is shown, counted or not: a job stored before a cause existed (handed_back) shows it as 0.
        out["attempts"] = {**{cause.value: 0 for cause in AttemptCause}, **out["attempts"]}
    spec = out.get("spec") or {}
    out["signal"] = signal_block(str(out.get("state")), signal)
    out["ceiling_history"] = with_previous(out.get("ceiling_history"))
    prov = live.provisional(out.get("state"), out.get("lease_epoch"), budget)
    block = budget_block(budget, out)
    if block is not None:
        block = live.live_budget(block, prov)
        block["ceiling_history"] = with_previous(block.get("ceiling_history"))
    out["budget"] = block
    if usage is not None:
        out["interruption_cost"] = live.interruption_cost(out, usage, prov)
    # The budget service measures step time too (from usage reports); its ETA stands in when the queue has none.
    measured = (budget or {}).get("checkpoint")
    measured_eta = measured.get("next_eta_seconds") if isinstance(measured, Mapping) else None
    out["checkpoint"] = checkpoint_block(spec if isinstance(spec, Mapping) else {}, out, out["signal"], measured_eta)
    if events is not None:
        out["events"] = [pick(e, EVENT_FIELDS) for e in events]
    return out
