"""Which organisation a request acts in: pure rules, no I/O.

A token bound to an organisation submits into it and may not name another (403, audited like every refusal); a
fleet-wide token (operators and admins, unless bound) names the organisation with ``?org=`` or submits into the
default one. Usage reports follow the same rule: an organisation's token sees its own organisation only. A token
limited to a project (issue 30) submits into that project only.
"""

from __future__ import annotations

from libs.contracts.tenancy import DEFAULT_ORG, DEFAULT_PROJECT

from .auth import AuthError, Principal


def acting_org(principal: Principal, asked: str | None) -> str:
    """The organisation a submit or usage query acts in, or AuthError 403 when the token may not name it."""
    if principal.org is None:
        return asked or DEFAULT_ORG
    if asked is not None and asked != principal.org:
        raise AuthError(403, f"this token acts in organisation {principal.org!r}, not {asked!r}",
                        actor=principal.actor)
    return principal.org


def acting_project(principal: Principal, asked: str) -> str:
    """The project a submit goes to: a token limited to a project submits into it (a spec naming the default
    project is put there) and may not name another (403)."""
    if principal.project is None:
        return asked
    if asked not in (principal.project, DEFAULT_PROJECT):
        raise AuthError(403, f"this token is limited to project {principal.project!r}, not {asked!r}",
                        actor=principal.actor)
    return principal.project


def usage_org(principal: Principal, asked: str | None) -> str | None:
    """The organisation a usage report is restricted to (None: every one, fleet-wide tokens only)."""
    if principal.org is None:
        return asked
    return acting_org(principal, asked)
