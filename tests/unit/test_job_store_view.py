"""The job view's checkpoint_store block (services/gateway/domain/ckptstore.py), from the job's latest events."""

from __future__ import annotations

from services.gateway.domain.ckptstore import store_view


def ev(event: str, reason: str | None = None, **detail) -> dict:
    return {"event": event, "reason": reason, "detail": detail, "time": "t"}


def test_no_store_no_block():
    assert store_view([ev("started"), ev("checkpointed", step=10, path="/c/step-10.pt")]) is None


def test_uploading_stored_superseded_skipped_and_how_far_behind():
    events = [ev("checkpoint_uploading", step=10, path="step-00000010.pt", bytes=5, behind=1),
              ev("checkpointed", step=10, path="s3://b/j/manifests/step-00000010-e1.json", bytes=9, at="t1",
                 state="stored", upload_seconds=0.5),
              ev("checkpoint_uploading", step=20, bytes=5, behind=1),
              ev("checkpoint_uploading", "checkpoint store unavailable: connection refused", step=20, behind=1),
              ev("checkpoint_uploading", step=30, behind=2),
              ev("checkpoint_uploading", step=40, behind=3)]
    view = store_view(events)
    assert [(c["step"], c["state"]) for c in view["checkpoints"]] == [(40, "uploading"), (30, "uploading"),
                                                                      (20, "uploading"), (10, "stored")]
    assert view["behind"] == 3 and view["retrying"].startswith("checkpoint store unavailable")
    assert view["checkpoints"][-1]["location"].startswith("s3://") and view["checkpoints"][-1]["upload_seconds"] == 0.5
    later = store_view(events + [ev("checkpointed", step=40, path="s3://x", state="stored"),
                                 ev("checkpoint_skipped", "corrupt: ...", path="s3://b/j/e1-step-00000010/x")])
    assert [(c.get("step"), c["state"]) for c in later["checkpoints"]] == [
        (40, "stored"), (30, "superseded"), (20, "superseded"), (10, "stored"), (None, "skipped")]
    assert later["behind"] == 0 and later["retrying"] is None
    assert later["checkpoints"][-1]["location"] == "s3://b/j/e1-step-00000010/x"


def test_a_resume_waiting_for_the_store_until_its_run_starts():
    waiting = [ev("checkpoint_store_waiting", "checkpoint store s3://b unavailable (...); retrying in 4s", store="s3://b")]
    assert store_view(waiting)["waiting"].startswith("checkpoint store s3://b unavailable")
    assert store_view(waiting + [ev("started")])["waiting"] is None
