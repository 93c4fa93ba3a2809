"""The person's own page (``/me``): who they are, each role and the organisation with the claim, binding or
token it came from (the same as ``GET /v1/whoami``), and API tokens: one's own, or every token for an admin,
made and revoked through the API (``/v1/me/tokens``, ``/v1/tokens``) by me.js with the session's CSRF token.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse

from ...auth import ROLE_PERMISSIONS, Permission, Principal, Role
from ..web import render, signed_in
from ..nav import NavItem

NAV = NavItem("/me", "me.nav", Permission.READ, order=90)


def register(router: APIRouter) -> None:

    @router.get("/me", response_class=HTMLResponse)
    async def me_page(request: Request, principal: Principal = Depends(signed_in(Permission.READ))) -> HTMLResponse:
        admin = principal.can(Permission.TOKENS_ADMIN)
        identity = request.app.state.identity
        tokens = await identity.tokens(actor=None if admin else principal.actor)
        roles = [r.value for r in Role if admin or all(principal.can(p) for p in ROLE_PERMISSIONS[r])]
        return render(request, principal, "me.html", "me", messages=("me.",), tokens=tokens, admin=admin,
                      grants=[g.as_dict() for g in principal.grants], issuable=roles,
                      permissions=principal.permissions())
