"""The panel's job page shows the job's checkpoint store block: each checkpoint's state, location, size and upload
time, how far behind the store is and why it is retried (rendered from a job view as the API gives it)."""

from __future__ import annotations

from starlette.requests import Request

from services.gateway.domain.ckptstore import store_view
from services.gateway.panel import web
from services.gateway.panel.pages.job import figures


class Viewer:
    actor = "ann"

    def can(self, permission: str) -> bool:
        return permission == "read"


def _render(job: dict) -> str:
    request = Request({"type": "http", "method": "GET", "path": "/jobs/j1", "headers": [], "query_string": b""})
    ctx = web.context(request, Viewer(), "job")
    return web._env.get_template("job_live.html").render({**ctx, "job": job, "f": figures(job, [], Viewer())})


def _job(events: list[dict]) -> dict:
    return {"id": "j1", "name": "demo", "state": "running", "owner": "ann", "spec": {"checkpoint_every_steps": 10},
            "attempts": {}, "checkpoint": {"every_steps": 10}, "events": events,
            "checkpoint_store": store_view(events)}


def test_the_job_page_shows_the_store_block_only_with_a_store():
    stored = {"event": "checkpointed", "time": "t", "reason": None,
              "detail": {"step": 10, "path": "s3://teto-checkpoints/j1/manifests/step-00000010-e1.json",
                         "bytes": 123456, "state": "stored", "upload_seconds": 2.5}}
    uploading = {"event": "checkpoint_uploading", "time": "t", "reason": "checkpoint store unavailable: refused",
                 "detail": {"step": 20, "path": "step-00000020.pt", "bytes": 99, "behind": 1}}
    html = _render(_job([stored, uploading]))
    assert 'id="checkpoint-store"' in html and "s3://teto-checkpoints/j1/manifests/step-00000010-e1.json" in html
    assert 'data-state="stored"' in html and 'data-state="uploading"' in html
    assert "Checkpoints not stored yet: 1" in html and "checkpoint store unavailable: refused" in html
    assert 'id="checkpoint-store"' not in _render(_job([{**stored, "detail": {"step": 10, "path": "/c/x.pt"}}]))
