"""What every panel page shares: who is signed in, the locale, and rendering a template with the layout.

``signed_in(permission)`` is the dependency of a page: it resolves the session cookie through the gateway's own
authentication (auth.authenticate, with the session hook installed by ``mount``) and the gateway's own
permission check (auth.require), so a page and the API refuse the same people. Without a session a page
redirects to the sign-in form; without the permission it answers 403 with the forbidden page.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, Undefined, select_autoescape

from ..auth import AuthError, Permission, Principal, require
from . import fmt, i18n, words
from .nav import NavItem

TEMPLATES = Path(__file__).parent / "templates"
_env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(default=True),
                   trim_blocks=True, lstrip_blocks=True)


class PageForbidden(Exception):
    """A page the principal's role may not open: answered with the forbidden page (403)."""

    def __init__(self, principal: Principal | None, permission: str | None) -> None:
        super().__init__(permission)
        self.principal = principal
        self.permission = permission


class NeedsSignIn(Exception):
    """A page asked for without a (valid) session: answered with a redirect to the sign-in form."""

    def __init__(self, next_path: str) -> None:
        super().__init__(next_path)
        self.next_path = next_path


def _v(value: Any) -> Any:
    """A template value as Python sees it: a missing field (Jinja's Undefined) is None."""
    return None if isinstance(value, Undefined) else value


def locale_of(request: Request) -> str:
    return i18n.negotiate(request.cookies.get(i18n.LANG_COOKIE), request.headers.get("accept-language"))


def safe_next(path: str | None) -> str:
    """Where to go after signing in: a local path only (never ``//host`` or a scheme: no open redirect)."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/jobs"
    return path


class signed_in:  # noqa: N801 - a declaration on the route, like auth.require
    """Page dependency: the principal holding ``permission``; else sign-in redirect (401) or 403 page."""

    def __init__(self, permission: Permission = Permission.READ) -> None:
        self.check = require(permission).check

    async def __call__(self, request: Request) -> Principal:
        try:
            return await self.check(request)
        except AuthError as exc:
            if exc.status == 429:
                raise  # answered by the gateway's handler, Retry-After included
            if exc.status == 401:
                target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                raise NeedsSignIn(target) from None
            raise PageForbidden(getattr(request.state, "principal", None), exc.permission) from None


def navigation_of(request: Request) -> list[NavItem]:
    """The navigation ``mount`` collected from the pages into the app's state (none for a request without the
    panel's app): passed in, because the pages import this module."""
    state = getattr(request.scope.get("app"), "state", None)
    return getattr(state, "panel_navigation", None) or []


def context(request: Request, principal: Principal | None, page: str) -> dict[str, Any]:
    """What every template sees: the locale's translate and formatters, the navigation this principal may use,
    the session's CSRF token, and the page's name (for its catalogue and script)."""
    locale = locale_of(request)
    now = datetime.now(UTC)
    session = getattr(request.state, "panel_session", None)

    def t(key: str, **values: object) -> str:
        return i18n.translate(locale, key, **values)

    def t_or(key: str, fallback: object) -> object:
        """A known code's words (``job.reason_gpu_ceiling``), else the server's own text."""
        return i18n.catalogue(locale).get(key, fallback)

    return {
        "t_or": t_or,
        "request": request, "principal": principal, "page": page, "locale": locale, "locales": i18n.LOCALES,
        "t": t, "now": now,
        "number": lambda v, d=0: fmt.number(_v(v), locale, d), "duration": lambda s: fmt.duration(_v(s), locale),
        "gpu_time": lambda s: fmt.gpu_time(_v(s), locale), "size": lambda b: fmt.size(_v(b), locale),
        "significant": lambda v, d=4: fmt.significant(_v(v), locale, d), "timestamp": lambda v: fmt.timestamp(_v(v), locale),
        "age": lambda v: fmt.age(_v(v), now, locale), "percent": lambda p, w: fmt.percent(_v(p), _v(w), locale),
        "ratio": lambda p, w: fmt.ratio(_v(p), _v(w)),
        # the control plane's codes and sentences in the page's words (words.py)
        "reason": lambda text: words.reason(_v(text), locale), "waiting": lambda w: words.waiting(_v(w), locale),
        "audit_kind": lambda k: words.audit_kind(_v(k), locale),
        "audit_reason": lambda text: words.audit_reason(_v(text), locale),
        "metric": lambda name: words.metric(name, locale),
        "check_error": lambda text: words.check_error(_v(text), locale),
        "problem": lambda text: words.problem(_v(text), locale),
        "can": (lambda perm: principal is not None and principal.can(perm)),
        "nav": [item for item in navigation_of(request) if principal is not None and principal.can(item.permission)],
        "csrf": session.csrf if session is not None else "",
        "path": request.url.path, "quote": quote,
    }


def render(request: Request, principal: Principal | None, template: str, page: str, *, status: int = 200,
           messages: tuple[str, ...] = (), **values: Any) -> HTMLResponse:
    """A page in the layout. ``messages``: catalogue prefixes its script needs (embedded as JSON data)."""
    ctx = context(request, principal, page)
    ctx["client"] = {"locale": ctx["locale"], "messages": i18n.client_messages(ctx["locale"], ("common.", *messages)),
                     "page": page, "now": time.time()}
    ctx.update(values)
    html = _env.get_template(template).render(ctx)
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})
