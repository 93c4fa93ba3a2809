"""What the live feed sends, and to whom: pure rules from a bus message to a panel event, and its scoping.

A message of a watched stream becomes one small event ``{"type": ..., fields...}``: ``job`` (a job-state
event), ``signal`` (a job's signal changed), ``step`` / ``checkpoint`` / ``progress`` (training progress),
``budget`` (a budget warning or exhaustion), ``executor`` (a heartbeat), ``node`` and ``check`` (node
lifecycle, health-check progress). Only the fields a page shows travel; nothing from a spec, an env or a GPU
list does. A principal without ``read:all`` gets the events of its own jobs only, and executor heartbeats with
another owner's job id and step blanked, as GET /v1/executors shows them (scoping.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..auth import Principal
from ..scoping import JOB_COLUMNS, may_see

# Stream base name -> subject attribute of libs.contracts.subjects.Subjects the hub follows on it.
WATCHED = (("JOB", "job_all"), ("PROGRESS", "progress_all"), ("HB", "heartbeat_all"), ("BUDGET", "budget_all"),
           ("NODE", "node_all"), ("NODE", "check_all"))

FIELDS = ("job_id", "executor_id", "node_id", "run_id", "group", "event", "state", "previous_state", "seq",
          "reason", "signal", "previous", "since", "seconds_since_heartbeat", "seconds_since_step_change",
          "no_signal_after_seconds", "stuck_after_seconds", "step", "total_steps", "loss", "step_seconds", "phase",
          "kind", "status", "test", "passed", "figures", "consumed_seconds", "ceiling_seconds", "sent_at", "time")
JOB_BOUND = frozenset({"job", "signal", "step", "checkpoint", "progress", "budget"})


def event_type(stream: str, subject: str, body: Mapping[str, Any]) -> str | None:
    """The panel event type of a message, or None for what the panel does not show."""
    schema = str(body.get("schema") or "")
    if stream == "JOB":
        return "signal" if schema.startswith("teto.job.signal/") else "job"
    if stream == "PROGRESS":
        kind = body.get("kind")
        return kind if kind in ("step", "checkpoint") else "progress"
    if stream == "HB":
        return "executor"
    if stream == "BUDGET":
        return "budget"
    if stream == "NODE":
        return "check" if ".check." in f".{subject}." or schema.startswith("teto.check") else "node"
    return None


def to_event(stream: str, subject: str, body: Mapping[str, Any]) -> dict[str, Any] | None:
    kind = event_type(stream, subject, body)
    if kind is None:
        return None
    out: dict[str, Any] = {"type": kind}
    for field in FIELDS:
        value = body.get(field)
        if value is not None and (not isinstance(value, (dict, list)) or field == "figures"):
            out[field] = value
    if kind == "executor" and body.get("group") is not None:
        out["group"] = body["group"]
    return out


def scoped(event: Mapping[str, Any], principal: Principal, owner: str | None, *, sees_all: bool,
           only_job: str | None = None) -> dict[str, Any] | None:
    """The event as this principal may receive it (None: not at all). ``owner``: the owner of the event's job
    (None when unknown). ``only_job``: the tab follows this job only (its job-bound events; fleet events pass)."""
    job_id = event.get("job_id")
    bound = event.get("type") in JOB_BOUND
    if bound and only_job is not None and job_id != only_job:
        return None
    if job_id is None or sees_all or may_see(principal, owner):
        return dict(event)
    if bound:
        return None
    hidden = dict(event)
    for column in JOB_COLUMNS:
        hidden.pop(column, None)
    return hidden
