"""Times every HTTP request into ``teto_http_request_duration_seconds`` by route template (``/v1/jobs/{job_id}``,
never the raw path: ids would make a series per job), method and status. A request no route matched is
``unmatched``, so a scanner cannot make series without bound."""

from __future__ import annotations

import time
from typing import Any

from libs.runtime import metrics

UNMATCHED = "unmatched"


def route_template(scope: dict[str, Any]) -> str:
    """The matched route's path template (the router writes it into the scope), else ``unmatched``."""
    return getattr(scope.get("route"), "path", None) or UNMATCHED


class RouteTimer:
    """Pure ASGI middleware inside the body rewriting (it sees the scope the router fills in); a body refused
    by its declared length before any route runs is the one answer not timed."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the client sees when the app raises before answering

        async def timed_send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            metrics.HTTP_LATENCY.labels(route_template(scope), scope.get("method", ""), str(status)).observe(
                time.perf_counter() - started)
