"""API tokens: an admin (tokens:admin) makes, lists and revokes anyone's; every person their own, with a role
they hold, in their organisation (``may_issue``, pure). The secret is returned once; only its hash is kept.
Creating and revoking are recorded as gateway outcomes, so the audit log shows who gave access to whom.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import Depends, FastAPI, Path, Request, Response
from pydantic import Field

from libs.contracts.bounds import ID_PATTERN, Actor, Id, bounded_name
from libs.contracts.envelope import Model

from .. import auth
from ..auth import Permission, Principal, Role, require
from ..errors import not_found
from .admin import record


Description = bounded_name(500)


class TokenRequest(Model):
    actor: Actor | None = Field(None, pattern=r"^\S(.*\S)?$", description="Who the token acts as: 1-200 characters, "
                                "no control characters, not padded (default: oneself)")
    role: Role = Field(description="viewer, submitter, operator, auditor or admin")
    org: Id | None = Field(None, description="Organisation it acts in (default: fleet-wide for operator, auditor "
                                             "and admin, 'default' for the others)")
    project: Id | None = Field(None, description="Project it is limited to (recorded with the token)")
    description: Description = Field("", description="What the token is for (no control characters)")
    expires_in_days: float | None = Field(None, gt=0, le=3650, description="Expiry; unset: never")


def may_issue(principal: Principal, *, actor: str, role: Role, org: str | None) -> str | None:
    """Why ``principal`` may not make this token (None: it may). An admin makes any; anyone else only a token
    for itself that may do no more than it may (every permission of the role is one it holds), in its own
    organisation (never fleet-wide unless it is)."""
    if principal.can(Permission.TOKENS_ADMIN):
        return None
    if actor != principal.actor:
        return f"only an admin makes tokens for someone else ({actor!r})"
    beyond = sorted(p.value for p in auth.ROLE_PERMISSIONS[role] if not principal.can(p))
    if beyond:
        return f"role {role.value!r} may do what you may not ({', '.join(beyond)})"
    if principal.org is not None and auth.token_org(role, org) != principal.org:
        return f"a token must act in your organisation {principal.org!r}"
    return None


async def _issue(request: Request, principal: Principal, body: TokenRequest, org: str | None) -> dict[str, Any]:
    actor = body.actor or principal.actor
    refused = may_issue(principal, actor=actor, role=body.role, org=org)
    if refused:
        raise auth.AuthError(403, refused, permission=Permission.TOKENS_ADMIN.value, actor=principal.actor)
    expires = (datetime.now(UTC) + timedelta(days=body.expires_in_days)) if body.expires_in_days else None
    made = await request.app.state.identity.issue(actor, body.role, org=org, project=body.project,
                                                  description=body.description, expires_at=expires,
                                                  created_by=principal.actor)
    org = auth.token_org(body.role, org)
    await record(request, "token_create", principal, token_id=made.id, token_actor=actor, role=body.role.value,
                 org=org, expires_at=expires.isoformat() if expires else None)
    return {"id": made.id, "actor": actor, "role": body.role.value, "org": org, "project": body.project,
            "description": body.description, "expires_at": expires, "secret": made.secret,
            "permissions": sorted(p.value for p in auth.ROLE_PERMISSIONS[body.role])}


async def _revoke(request: Request, principal: Principal, token_id: str, mine: str | None) -> Response:
    if not await request.app.state.identity.revoke(token_id, by=principal.actor, actor=mine):
        raise not_found("token", token_id)
    await record(request, "token_revoke", principal, token_id=token_id)
    return Response(status_code=204)


def register(app: FastAPI) -> None:

    @app.post("/v1/tokens", status_code=201, tags=["access"], summary="Create a token (the secret is shown once)")
    async def create_token(request: Request, body: TokenRequest,
                           principal: Principal = Depends(require(Permission.TOKENS_ADMIN))) -> dict[str, Any]:
        return await _issue(request, principal, body, body.org)

    @app.get("/v1/tokens", tags=["access"], summary="Tokens (never their secrets or hashes)")
    async def list_tokens(request: Request,
                          _: Principal = Depends(require(Permission.TOKENS_ADMIN))) -> list[dict[str, Any]]:
        return await request.app.state.identity.tokens()

    @app.delete("/v1/tokens/{token_id}", status_code=204, tags=["access"],
                summary="Revoke a token: refused at once by every gateway replica")
    async def revoke_token(request: Request, token_id: str = Path(pattern=ID_PATTERN),
                           principal: Principal = Depends(require(Permission.TOKENS_ADMIN))) -> Response:
        return await _revoke(request, principal, token_id, None)

    @app.post("/v1/me/tokens", status_code=201, tags=["access"],
              summary="Create a token for oneself, with a role one holds (the secret is shown once)")
    async def create_own_token(request: Request, body: TokenRequest,
                               principal: Principal = Depends(require(Permission.READ))) -> dict[str, Any]:
        org = body.org if body.org is not None else principal.org
        return await _issue(request, principal, body, org)

    @app.get("/v1/me/tokens", tags=["access"], summary="One's own tokens")
    async def list_own_tokens(request: Request,
                              principal: Principal = Depends(require(Permission.READ))) -> list[dict[str, Any]]:
        return await request.app.state.identity.tokens(actor=principal.actor)

    @app.delete("/v1/me/tokens/{token_id}", status_code=204, tags=["access"], summary="Revoke one of one's tokens")
    async def revoke_own_token(request: Request, token_id: str = Path(pattern=ID_PATTERN),
                               principal: Principal = Depends(require(Permission.READ))) -> Response:
        return await _revoke(request, principal, token_id, principal.actor)
