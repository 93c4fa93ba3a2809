"""What HTTP status a command's outcome becomes. Pure.

accepted -> 201 (submit) or 200; refused because the job does not exist -> 404; refused because a value is too
small or otherwise unacceptable (requeue ceiling below consumed + 60, carried as numbers in ``detail``) -> 422;
a dependency of the decider unavailable (e.g. the budget service) -> 503; any other refusal (wrong state,
duplicate) -> 409. No outcome in time -> 202: the command is durable and will
still be processed.
"""

from __future__ import annotations

from collections.abc import Mapping
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
