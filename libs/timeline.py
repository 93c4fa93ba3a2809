"""A job's events read as a timeline: runs of checkpoints folded into one row each.

Shared by the panel's job page (services/gateway/panel/jobview.py) and ``teto job`` (teto/cli_client.py). Pure
and imports nothing but the standard library, so the CLI, an HTTP client only, loads it without the contracts'
pydantic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FOLDED = frozenset({"checkpointed"})  # events that come in runs, one per few steps: one timeline row a run


def timeline(events: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The timeline's rows, newest first, from the events shown (oldest first, as the API lists them).

    A run of consecutive events of a ``FOLDED`` kind in one lease epoch is one row: how many, their first and
    last step, time and sequence number (a fine-tune checkpointing every few steps would otherwise fill the list
    and push the events that matter, a start, a stop, a requeue, out of it). ``earlier``: older events exist than
    the first shown (its sequence number is past 1), so the page points to the whole list. ``resumed_from``: the
    checkpoint step a run started from (its ``started`` event; None: from scratch, or another event)."""
    rows: list[dict[str, Any]] = []
    for e in events:
        last = rows[-1] if rows else None
        if (last is not None and e.get("event") in FOLDED and last["event"] == e.get("event")
                and last["epoch"] == e.get("epoch")):
            last["count"] += 1
            last["last_time"], last["last_step"], last["last_seq"] = e.get("time"), _step(e), e.get("seq")
            last["state"] = e.get("state")
            continue
        step = _step(e) if e.get("event") in FOLDED else None
        rows.append({"event": e.get("event"), "state": e.get("state"), "reason": e.get("reason"),
                     "executor_id": e.get("executor_id"), "epoch": e.get("epoch"), "count": 1,
                     "seq": e.get("seq"), "last_seq": e.get("seq"), "time": e.get("time"), "last_time": e.get("time"),
                     "first_step": step, "last_step": step, "resumed_from": _step(e, "resumed_from_step")})
    first_seq = events[0].get("seq") if events else None
    return {"rows": rows[::-1], "earlier": isinstance(first_seq, int) and first_seq > 1}


def _step(event: Mapping[str, Any], field: str = "step") -> int | None:
    """A step number from the event's detail (``step`` of a checkpoint, ``resumed_from_step`` of a start)."""
    detail = event.get("detail")
    step = detail.get(field) if isinstance(detail, Mapping) else None
    return step if isinstance(step, int) and not isinstance(step, bool) else None
