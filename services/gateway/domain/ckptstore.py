"""The job view's ``checkpoint_store`` block: each recent checkpoint's place and state when a checkpoint store
holds them (docs/checkpoint-store.md), from the job's latest events. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

STORE_EVENTS = {"checkpoint_uploading", "checkpoint_store_waiting"}


def store_view(events: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """None when no event says a store is used. Else ``checkpoints`` (newest first): ``uploading`` (reported by
    the run, not stored yet), ``stored`` (its manifest in the store: location, bytes, upload time),
    ``superseded`` (a newer one was stored first), ``skipped`` (the object or file and why); ``behind``: how many
    are uploading; ``retrying``: why the store is being retried, while it is; ``waiting``: a resume waiting for the
    store, until its run starts."""
    events = list(events)
    if not any(e.get("event") in STORE_EVENTS or _stored(e) for e in events):
        return None
    steps: dict[int, dict[str, Any]] = {}
    skipped: list[dict[str, Any]] = []
    retrying = waiting = None
    last_stored = -1
    for e in events:
        kind, detail = e.get("event"), e.get("detail") or {}
        step = detail.get("step")
        if kind == "checkpoint_uploading" and isinstance(step, int):
            entry = steps.setdefault(step, {"step": step, "state": "uploading"})
            entry.update(path=detail.get("path"), bytes=detail.get("bytes"), reported_at=e.get("time"))
            retrying = e.get("reason") or retrying
        elif _stored(e) and isinstance(step, int):
            steps[step] = {"step": step, "state": "stored", "location": detail.get("path"), "bytes": detail.get("bytes"),
                           "stored_at": detail.get("at"), "upload_seconds": detail.get("upload_seconds")}
            last_stored, retrying = max(last_stored, step), None
        elif kind == "checkpoint_skipped":
            skipped.append({"state": "skipped", "location": detail.get("path"), "reason": e.get("reason"),
                            "at": e.get("time")})
        elif kind == "checkpoint_store_waiting":
            waiting = e.get("reason")
        elif kind == "started":
            waiting = None
    for entry in steps.values():
        if entry["state"] == "uploading" and entry["step"] < last_stored:
            entry["state"] = "superseded"
    behind = sum(1 for s in steps.values() if s["state"] == "uploading")
    return {"checkpoints": sorted(steps.values(), key=lambda s: -s["step"]) + skipped[::-1], "behind": behind,
            "retrying": retrying if behind else None, "waiting": waiting}


def _stored(event: Mapping[str, Any]) -> bool:
    return event.get("event") == "checkpointed" and (event.get("detail") or {}).get("state") == "stored"
