"""Sign-in with an API token, sign-out, and the language switch.

Sign-in is a plain HTML form (it works before any script runs): the form carries a one-off CSRF token that must
equal the ``teto_signin`` cookie (login CSRF: another site cannot sign a browser into its own account). A token
the tokens file accepts becomes a sealed session cookie (session.py); a wrong one is answered 401 with the form
again. The body is read as a form whatever its Content-Type (the gateway labels every body JSON, limits.py).
A wrong token or a form without its CSRF token is a failed sign-in: counted per source address and per actor
(the revoked token's), logged and audited as ``sign_in`` (throttle.py); a blocked source or actor gets 429 with
the form and a message, and its token is not looked at.
"""

from __future__ import annotations

import time
from urllib.parse import parse_qs

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ...auth import AuthError, Failure, refuse_if_blocked, source_of
from ...domain import oidc as oidc_rules
from ...domain import tokens as records
from ...oidc import ProviderUnavailable
from ...routes.admin import record
from ...routes.sessions import public_base
from ...domain.attempts import Scope
from ...throttle import record_failure
from .. import i18n, session
from ..web import render, safe_next

NAV = None


async def form_of(request: Request) -> dict[str, str]:
    """An url-encoded form body as a dict of first values."""
    raw = await request.body()
    fields = parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=20)
    return {k: v[0] for k, v in fields.items()}


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def limited(request: Request, exc: AuthError, next_path: str) -> Response:
    response = sign_in_form(request, next_path=next_path, error="signin.error_limited", status=429)
    response.headers["Retry-After"] = str(max(1, int(exc.retry_after or 1) + 1))
    return response


def sign_in_form(request: Request, *, next_path: str, error: str | None = None, status: int = 200) -> Response:
    csrf = session.new_csrf()
    found = getattr(request.app.state, "oidc", None)
    providers = list(found.configs.values()) if found is not None else []
    response = render(request, None, "signin.html", "signin", status=status, form_csrf=csrf, next_path=next_path,
                      error=error, providers=providers)
    response.set_cookie(session.PRE_COOKIE, csrf, **session.cookie_options(secure=_secure(request), max_age=3600))
    return response


async def end_provider_session(request: Request, secret: str) -> str | None:
    """End a provider session in the database (every replica refuses it from now on), audit the sign-out, and
    return the provider's logout address (RP-initiated logout) where it offers one."""
    identity = request.app.state.identity
    principal = await identity.authenticate(secret)
    if principal is None:
        return None
    ended = await identity.end_session(principal.token_id, "signed out")
    await record(request, "sign_out", principal, session=principal.token_id)
    providers = getattr(request.app.state, "oidc", None)
    config = providers.get(ended["provider"]) if providers is not None and ended else None
    if config is None:
        return None
    try:
        doc = await providers.discovery(config.name)
    except ProviderUnavailable:
        return None
    return oidc_rules.end_session_url(doc.get("end_session_endpoint"), id_token=ended.get("id_token"),
                                      client_id=config.client_id, after=f"{public_base(request)}/signin")


def register(router: APIRouter) -> None:

    @router.get("/", include_in_schema=False)
    async def home() -> RedirectResponse:
        return RedirectResponse("/jobs", status_code=303)

    @router.get("/signin", response_class=HTMLResponse)
    async def signin_page(request: Request, next: str | None = None) -> Response:  # noqa: A002 - the query name
        return sign_in_form(request, next_path=safe_next(next))

    @router.post("/signin")
    async def signin(request: Request) -> Response:
        form = await form_of(request)
        next_path = safe_next(form.get("next"))
        identity = request.app.state.identity
        try:
            refuse_if_blocked(request, Scope.SOURCE, source_of(request))  # before the token is looked at
            if not session.csrf_ok(request.cookies.get(session.PRE_COOKIE), form.get("csrf")):
                await record_failure(request, Failure.SIGN_IN_CSRF, "sign-in form posted without its CSRF token", None)
                return sign_in_form(request, next_path=next_path, error="signin.error_csrf", status=403)
            typed = form.get("token", "").strip()
            principal = await identity.authenticate(typed) if typed.startswith(records.TOKEN_PREFIX) else None
            if principal is None:
                actor = await identity.revoked_actor(typed) if typed else None
                if actor is not None:
                    refuse_if_blocked(request, Scope.ACTOR, actor, actor)
                await record_failure(request, Failure.SIGN_IN, "unknown or revoked token typed into the sign-in form",
                                     actor)
                return sign_in_form(request, next_path=next_path, error="signin.error_token", status=401)
            refuse_if_blocked(request, Scope.ACTOR, principal.actor, principal.actor)
        except AuthError as exc:
            return limited(request, exc, next_path)
        value, _ = session.seal(request.app.state.panel_key, form["token"].strip(), now=time.time())
        response = RedirectResponse(next_path, status_code=303)
        response.set_cookie(session.COOKIE, value, **session.cookie_options(secure=_secure(request)))
        response.delete_cookie(session.PRE_COOKIE, path="/")
        return response

    @router.post("/signout")
    async def signout(request: Request) -> Response:
        form = await form_of(request)
        found = session.unseal(request.app.state.panel_key, request.cookies.get(session.COOKIE), now=time.time())
        if found is not None and not session.csrf_ok(found.csrf, form.get("csrf")):
            return Response("missing or wrong CSRF token", status_code=403, media_type="text/plain")
        logout = None
        if found is not None and found.secret.startswith(records.SESSION_PREFIX):
            logout = await end_provider_session(request, found.secret)
        # The provider's logout is another origin: a page that goes there, since the panel's CSP (form-action
        # 'self') stops a form's redirect to another origin.
        response: Response = (render(request, None, "signin_done.html", "signin", next_path=logout) if logout
                              else RedirectResponse("/signin", status_code=303))
        response.delete_cookie(session.COOKIE, path="/")
        return response

    @router.get("/lang/{locale}")
    async def switch_language(request: Request, locale: str, next: str | None = None) -> Response:  # noqa: A002
        """The visible switch: remembers the choice in a cookie (a preference, not a change of state)."""
        response = RedirectResponse(safe_next(next), status_code=303)
        if locale in i18n.LOCALES:
            response.set_cookie(i18n.LANG_COOKIE, locale, max_age=365 * 86400, path="/", samesite="strict",
                                httponly=True, secure=_secure(request))
        return response

