"""Sign-in through an OpenID Connect provider: the authorization code flow with PKCE, ``state`` and ``nonce``.

``GET /signin/oidc/<provider>`` stores a pending sign-in (state, nonce, PKCE verifier, where to go next) in the
gateway's schema, so any replica can finish it, binds its state to this browser with a short-lived cookie
(login CSRF: a callback started in another browser is refused), and redirects to the provider.
``GET /signin/oidc/<provider>/callback`` consumes the pending sign-in (a replayed callback finds nothing),
exchanges the code with the verifier, checks the ID token (domain/oidc.py: key, signature, issuer, audience,
expiry, this sign-in's nonce), maps the claims to roles and an organisation (domain/grants.py), opens a session
in the database and seals its secret into the panel's cookie. Each refusal is a failed sign-in: counted, logged
and audited (kind ``sign_in``, failure ``oidc``, the reason naming the check); a sign-in is audited with every
role and where it came from.
"""

from __future__ import annotations

import math
import secrets
import time
from datetime import timedelta

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from ...auth import AuthError, Failure, refuse_if_blocked, source_of
from ...domain import oidc as rules
from ...domain.attempts import Scope
from ...domain.grants import NoRole
from ...oidc import ProviderUnavailable
from ...routes.sessions import audit_sign_in, public_base
from ...throttle import count_start, pending_full, record_failure
from .. import session
from ..web import render, safe_next

NAV = None
STATE_COOKIE = "teto_oidc"
PENDING_SECONDS = 600  # a sign-in not finished within this is forgotten


def _providers(request: Request):
    return getattr(request.app.state, "oidc", None)


def callback_url(request: Request, name: str) -> str:
    return f"{public_base(request)}/signin/oidc/{name}/callback"


def _too_many(reason: str, retry_after: float) -> Response:
    return Response(reason, status_code=429, headers={"Retry-After": str(math.ceil(retry_after) + 1)})


async def refused(request: Request, reason: str, *, actor: str | None = None, status: int = 401) -> Response:
    await record_failure(request, Failure.OIDC, reason, actor)
    response = render(request, None, "signin_failed.html", "signin", status=status, reason=reason)
    response.delete_cookie(STATE_COOKIE, path="/signin/oidc")
    return response


def register(router: APIRouter) -> None:

    @router.get("/signin/oidc/{name}")
    async def start(request: Request, name: str, next: str | None = None) -> Response:  # noqa: A002
        providers = _providers(request)
        if providers is None or providers.get(name) is None:
            return render(request, None, "not_found.html", "common", status=404)
        try:
            refuse_if_blocked(request, Scope.SOURCE, source_of(request))
            refuse_if_blocked(request, Scope.SIGN_IN_START, source_of(request))
            if (blocked := await count_start(request)) is not None:  # bounds on pending rows: domain/pending.py
                return _too_many(f"too many sign-ins started from this source; try again in {blocked:.0f} s",
                                 blocked)
            doc = await providers.discovery(name)
        except AuthError as exc:
            return _too_many(exc.reason, exc.retry_after or 1)
        except ProviderUnavailable as exc:
            return render(request, None, "signin_failed.html", "signin", status=502, reason=str(exc))
        config = providers.get(name)
        state, nonce = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        verifier = rules.new_verifier(secrets.token_bytes(32))
        full = await request.app.state.identity.save_login(
            state=state, provider=name, nonce=nonce, verifier=verifier, next_path=safe_next(next),
            lifetime=timedelta(seconds=PENDING_SECONDS), cap=request.app.state.settings.oidc_pending_max)
        await pending_full(request, full)
        if full is not None:
            return _too_many(full.reason, full.retry_after)
        url = rules.authorization_url(doc["authorization_endpoint"], client_id=config.client_id,
                                      redirect_uri=callback_url(request, name), scopes=tuple(config.scopes),
                                      state=state, nonce=nonce, verifier=verifier)
        response = RedirectResponse(url, status_code=303)
        # Lax, not Strict: the provider's redirect back is a cross-site top-level navigation.
        response.set_cookie(STATE_COOKIE, state, httponly=True, samesite="lax", secure=request.url.scheme == "https",
                            path="/signin/oidc", max_age=PENDING_SECONDS)
        return response

    @router.get("/signin/oidc/{name}/callback")
    async def callback(request: Request, name: str, code: str | None = None, state: str | None = None,
                       error: str | None = None, error_description: str | None = None) -> Response:
        providers = _providers(request)
        if providers is None or providers.get(name) is None:
            return render(request, None, "not_found.html", "common", status=404)
        try:
            refuse_if_blocked(request, Scope.SOURCE, source_of(request))
        except AuthError as exc:
            return _too_many(exc.reason, exc.retry_after or 1)
        if error:
            return await refused(request, f"the provider answered {error[:100]}: {(error_description or '')[:300]}")
        if not rules.same_state(request.cookies.get(STATE_COOKIE), state):
            return await refused(request, "state does not match this browser's sign-in (login CSRF or a replay)",
                                 status=403)
        pending = await request.app.state.identity.take_login(state or "")
        if pending is None or pending["provider"] != name or not code:
            return await refused(request, "no pending sign-in with this state (used already, or expired)",
                                 status=403)
        config = providers.get(name)
        try:
            tokens = await providers.exchange(name, code=code, verifier=pending["verifier"],
                                              redirect_uri=callback_url(request, name))
            id_token = tokens.get("id_token")
            if not isinstance(id_token, str):
                raise ProviderUnavailable("the token endpoint returned no id_token")
            claims = await providers.check_id_token(name, id_token, client_id=config.client_id,
                                                    nonce=pending["nonce"])
            who = providers.identity(name, claims, await request.app.state.identity.bindings(name))
        except ProviderUnavailable as exc:
            return await refused(request, f"provider {name}: {exc}")
        except rules.IdTokenRefused as exc:
            return await refused(request, str(exc))
        except NoRole as exc:
            return await refused(request, str(exc), actor=exc.actor, status=403)
        lifetime = request.app.state.settings.session_lifetime_seconds
        made = await request.app.state.identity.open_session(who, provider=name, kind="panel", id_token=id_token,
                                                             lifetime=timedelta(seconds=lifetime))
        await audit_sign_in(request, who, provider=name, session_id=made.id, kind="panel")
        value, _ = session.seal(request.app.state.panel_key, made.secret, now=time.time(), lifetime=lifetime)
        # A page, not a redirect: after a cross-site chain a Strict cookie is sent only from a same-site page.
        response = render(request, None, "signin_done.html", "signin", next_path=pending["next_path"])
        response.set_cookie(session.COOKIE, value, **session.cookie_options(secure=request.url.scheme == "https",
                                                                            max_age=int(lifetime)))
        response.delete_cookie(STATE_COOKIE, path="/signin/oidc")
        return response
