"""What HTTP status a command's outcome becomes. Pure.

accepted -> 201 (submit) or 200; refused because the job does not exist -> 404; refused because a value is too
small or otherwise unacceptable (requeue ceiling below consumed + 60, carried as numbers in ``detail``) -> 422;
a dependency of the decider unavailable (e.g. the budget service) -> 503; any other refusal (wrong state,
duplicate) -> 409. No outcome in time -> 202: the command is durable and will
still be processed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Keys a refusal carries when the value given was unacceptable (the queue's requeue rule names these).
VALUE_KEYS = frozenset({"minimum", "minimum_seconds", "min_ceiling_seconds", "given", "given_seconds"})


def status_for(kind: str, accepted: bool | None, reason: str | None = None,
               detail: Mapping[str, Any] | None = None) -> int:
    if accepted is None:
        return 202
    if accepted:
        return 201 if kind == "submit" else 200
    text = (reason or "").lower()
    if "no such job" in text or "unknown job" in text or "not found" in text:
        return 404
    if "unavailable" in text:  # the decider could not ask a service it depends on: retry later, nothing changed
        return 503
    if VALUE_KEYS & set(detail or {}) or "ceiling" in text and "minimum" in text:
        return 422
    return 409


def prefers_async(prefer: str | None) -> bool:
    """Whether a ``Prefer`` header (RFC 7240) asks for ``respond-async``: the answer once the command is durable,
    without waiting for its decision. Preferences are comma-separated, names case-insensitive, parameters after
    ``;`` ignored. Pure."""
    if not prefer:
        return False
    return any(part.split(";", 1)[0].split("=", 1)[0].strip().lower() == "respond-async"
               for part in prefer.split(","))


def command_view(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """A command as its audit rows tell it (``audit.log_public``, in order), or None when none is recorded yet:
    ``pending`` while only its receipt is recorded, else ``accepted`` or ``refused`` as its last outcome says, with
    the reason, the deciding part (``by``) and the outcome's ``detail``. A command refused before it reached its
    owner (by the gateway) has no receipt row: its outcome alone says it all. Pure."""
    if not rows:
        return None
    received = next((r for r in rows if r.get("outcome") == "received"), None)
    decided = [r for r in rows if r.get("outcome") in ("accepted", "refused")]
    last = decided[-1] if decided else {}
    outcome = last.get("payload") if isinstance(last.get("payload"), dict) else {}
    first = received or rows[0]
    return {"command_id": first.get("command_id"), "kind": first.get("kind") or last.get("kind"),
            "actor": next((r.get("actor") for r in rows if r.get("actor")), None),
            "job_id": next((r.get("job_id") for r in rows if r.get("job_id")), None),
            "status": last.get("outcome", "pending"), "reason": last.get("reason"), "by": outcome.get("by"),
            "detail": outcome.get("detail") or {},
            "received_at": received.get("time") if received else None, "decided_at": last.get("time")}
