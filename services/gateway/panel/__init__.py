"""The operator panel: server-rendered pages under ``/`` (the API stays under ``/v1``), served by the gateway.

``mount(app, runtime)`` adds, to the gateway's FastAPI app:
- the session hook auth.authenticate consults when a request has no bearer token (session.py: sealed cookie,
  CSRF on every state-changing request), so the panel's scripts call the same ``/v1`` API, refused by the same
  permission checks;
- the security headers of every response (a Content-Security-Policy without inline scripts or styles);
- the static assets (``/static``), the live feed (``/live``, live.py) and each page of ``pages/``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..auth import AuthError, Failure, bearer_secret, refuse_if_blocked
from ..domain.attempts import Scope as Counted
from . import live, session
from .pages import navigation, pages
from .web import NeedsSignIn, PageForbidden, render

STATIC = Path(__file__).parent / "static"

# No inline script or style anywhere: scripts and styles come from /static only; data goes in
# <script type="application/json"> blocks, which are never executed.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "font-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'")
SECURITY_HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"), (b"x-frame-options", b"DENY")]


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, with_headers)


async def session_secret(request: Request) -> str | None:
    """The API token of the request's panel session (auth.authenticate's fallback when there is no bearer).
    A state-changing request must carry the session's CSRF token in X-CSRF-Token, else 403."""
    if bearer_secret(request) is not None:
        return None
    found = session.unseal(request.app.state.panel_key, request.cookies.get(session.COOKIE), now=time.time())
    if found is None:
        return None
    if session.needs_csrf(request.method) and not session.csrf_ok(found.csrf, request.headers.get(session.CSRF_HEADER)):
        # The session names its actor (its sealed token): the refusal is counted and audited under it.
        identity = request.app.state.identity
        principal = await identity.authenticate(found.secret)
        actor = principal.actor if principal is not None else await identity.revoked_actor(found.secret)
        if actor is not None:
            refuse_if_blocked(request, Counted.ACTOR, actor, actor)
        raise AuthError(403, "missing or wrong CSRF token (X-CSRF-Token) for a request made with a panel session",
                        actor=actor, failure=Failure.CSRF)
    request.state.panel_session = found
    return found.secret


def mount(app: FastAPI, runtime: Any = None) -> None:
    app.state.panel_key = session.session_key(getattr(app.state, "secrets_key", None))
    app.state.session_secret = session_secret
    app.state.live = live.Hub(runtime, lambda: app.state.reads)
    app.state.panel_navigation = navigation()  # what the layout links to (web.navigation_of)
    app.add_middleware(SecurityHeaders)
    app.mount("/static", StaticFiles(directory=STATIC), name="panel-static")

    @app.exception_handler(NeedsSignIn)
    async def to_sign_in(request: Request, exc: NeedsSignIn) -> RedirectResponse:
        return RedirectResponse(f"/signin?next={quote(exc.next_path, safe='/')}", status_code=303)

    @app.exception_handler(PageForbidden)
    async def forbidden(request: Request, exc: PageForbidden) -> HTMLResponse:
        return render(request, exc.principal, "forbidden.html", "common", status=403, permission=exc.permission)

    router = APIRouter(include_in_schema=False)

    @router.get("/favicon.ico")
    async def favicon() -> FileResponse:
        """Browsers ask for /favicon.ico whatever the page links: the same icon, not a 404 in every log."""
        return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")

    live.register(router)
    for page in pages():
        page.register(router)
    app.include_router(router)
