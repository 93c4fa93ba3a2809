"""The control plane's own health (``fleet:manage``, as ``GET /v1/status`` and ``teto status``): the verdict and
each problem first, then every service's replicas (started, NATS server, metrics port or why it is not served) and
who holds each singleton, the NATS members and streams, consumer lag, the database, the executors by state, and
how many dead letters each service keeps (a link to them).

The same gathering as the API (services/gateway/routes/status.py ``current_status``). With ``fragment=1`` only
the view is answered; the page asks for it again every ``REFRESH_SECONDS`` (panel.js ``data-refresh-every``),
so an operator watching a member or a replica come back sees it without reloading.
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from ...auth import Permission, Principal
from ...routes.status import current_status
from ..web import render, signed_in
from ..nav import NavItem

NAV = NavItem("/status", "status.nav", Permission.FLEET_MANAGE, order=35)
REFRESH_SECONDS = 10  # each view asks every replica, every NATS member and the database: not on every event
DEAD_COUNT_TIMEOUT_SECONDS = 3.0


def register(router: APIRouter) -> None:

    @router.get("/status")
    async def status(request: Request, fragment: bool = False,
                     principal: Principal = Depends(signed_in(Permission.FLEET_MANAGE))) -> Response:
        template = "status_view.html" if fragment else "status.html"
        return render(request, principal, template, "status", view=await current_status(request),
                      dead=await dead_counts(request), refresh_seconds=REFRESH_SECONDS)


async def dead_counts(request: Request) -> dict[str, int] | str | None:
    """Dead letters kept per service (one stream info, no message read), the reason when they could not be
    counted, None without a bus. Not a problem of the control plane: messages kept for an operator to read."""
    letters = getattr(request.app.state, "dead_letters", None)
    if letters is None:
        return None
    try:
        return await asyncio.wait_for(letters.counts(), DEAD_COUNT_TIMEOUT_SECONDS)
    except Exception as exc:  # noqa: BLE001 - the rest of the page stands without them
        return f"{type(exc).__name__}: {exc}"[:300]
