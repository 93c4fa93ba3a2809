"""Dead letters (``fleet:manage``, as ``GET /v1/dead-letters`` and ``teto dead-letters``): the messages a service
gave up on (malformed, permanently refused, out of deliveries, unpublishable), how many each service holds, and
each one with why, where it came from and what it carried (payloads with sealed secrets redacted, as the API
shows them); a Replay button per letter (static/dead_letters.js calls ``POST /v1/dead-letters/<seq>/replay``,
audited as the API's) once its cause is fixed. Oldest first, 50 a page, filtered by service.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response

from libs.contracts.bounds import MAX_SAFE_INT

from ...auth import Permission, Principal
from ...routes.dead_letters import SERVICE_PATTERN, page_of
from ..web import render, signed_in
from ..nav import NavItem

NAV = NavItem("/dead-letters", "dead.nav", Permission.FLEET_MANAGE, order=37)
PAGE_SIZE = 50


def register(router: APIRouter) -> None:

    @router.get("/dead-letters")
    async def dead_letters(request: Request, service: str | None = Query(None, pattern=SERVICE_PATTERN),
                           after_seq: int = Query(0, ge=0, le=MAX_SAFE_INT),
                           principal: Principal = Depends(signed_in(Permission.FLEET_MANAGE))) -> Response:
        letters = getattr(request.app.state, "dead_letters", None)
        listing = None if letters is None else await page_of(letters, service=service, after_seq=after_seq,
                                                             limit=PAGE_SIZE)
        return render(request, principal, "dead_letters.html", "dead", messages=("dead.",), listing=listing,
                      service=service, first_page=after_seq == 0)
