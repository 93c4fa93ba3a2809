"""API tokens (tokens:admin) and the audit log (audit:read).

Token secrets are returned once, at creation; the file keeps only their hashes. Creating and revoking a
token are recorded as gateway outcomes so the audit log shows who gave access to whom.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Depends, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from pydantic import Field

from libs.contracts.bounds import MAX_SAFE_INT, Actor, Id, Time
from libs.contracts.commands import CommandOutcome
from libs.contracts.envelope import Model, new_id

from .. import auth
from ..audit_verify import AuditVerifierUnavailable
from ..auth import Permission, Principal, Role, require
from ..errors import ApiError, not_found
from . import reads_of


class TokenRequest(Model):
    actor: Actor = Field(pattern=r"^\S(.*\S)?$",
                         description="Who the token acts as: 1-200 characters, no control characters, not padded")
    role: Role = Field(description="viewer, submitter, operator, auditor or admin")
    org: Id | None = Field(None, description="Organisation it acts in (default: fleet-wide for operator, auditor "
                                             "and admin, 'default' for the others)")


async def _record(request: Request, kind: str, principal: Principal, **detail: Any) -> None:
    commands = request.app.state.commands
    if commands is not None:
        await commands.record(CommandOutcome(command_id=new_id(), kind=kind, accepted=True, by="gateway",
                                             detail={"actor": principal.actor, **detail}))


def register(app: FastAPI) -> None:

    @app.post("/v1/tokens", status_code=201, tags=["access"], summary="Create a token (the secret is shown once)")
    async def create_token(request: Request, body: TokenRequest,
                           principal: Principal = Depends(require(Permission.TOKENS_ADMIN))) -> dict[str, Any]:
        path = request.app.state.tokens.path
        token_id, secret = auth.issue_token(path, body.actor, body.role, org=body.org)
        org = auth.token_org(body.role, body.org)
        await _record(request, "token_create", principal, token_id=token_id, token_actor=body.actor,
                      role=body.role.value, org=org)
        return {"id": token_id, "actor": body.actor, "role": body.role.value, "org": org, "secret": secret,
                "permissions": sorted(p.value for p in auth.ROLE_PERMISSIONS[body.role])}

    @app.get("/v1/tokens", tags=["access"], summary="Tokens (never their secrets or hashes)")
    async def list_tokens(request: Request,
                          _: Principal = Depends(require(Permission.TOKENS_ADMIN))) -> list[dict[str, Any]]:
        return auth.list_tokens(request.app.state.tokens.path)

    @app.delete("/v1/tokens/{token_id}", status_code=204, tags=["access"], summary="Revoke a token")
    async def revoke_token(request: Request, token_id: str,
                           principal: Principal = Depends(require(Permission.TOKENS_ADMIN))) -> Response:
        if not auth.revoke_token(request.app.state.tokens.path, token_id):
            raise not_found("token", token_id)
        await _record(request, "token_revoke", principal, token_id=token_id)
        return Response(status_code=204)

    @app.get("/v1/audit", tags=["audit"], summary="The audit log, filtered, in order (page with after_seq)")
    async def audit_log(request: Request, actor: Actor | None = Query(None), job_id: Id | None = Query(None),
                        kind: Id | None = Query(None), since: Time | None = Query(None),
                        until: Time | None = Query(None), after_seq: int = Query(0, ge=0, le=MAX_SAFE_INT),
                        limit: int = Query(100, ge=1, le=1000),
                        _: Principal = Depends(require(Permission.AUDIT_READ))) -> dict[str, Any]:
        rows = await reads_of(request).audit({"actor": actor, "job_id": job_id, "kind": kind, "since": since,
                                              "until": until, "after_seq": after_seq, "limit": limit})
        nxt = rows[-1]["seq"] if len(rows) == limit else None
        return {"entries": jsonable_encoder(rows), "next_after_seq": nxt}

    @app.get("/v1/audit/verify", tags=["audit"],
             summary="The audit service checks its log: chain, every row's mac, every anchor; names the first bad "
             "row or anchor")
    async def audit_verify(request: Request,
                           _: Principal = Depends(require(Permission.AUDIT_READ))) -> dict[str, Any]:
        try:
            result = await reads_of(request).audit_verify()
        except AuditVerifierUnavailable as exc:
            raise ApiError(503, "unavailable", str(exc)) from None
        if result is None:
            raise ApiError(503, "unavailable", "the gateway is not connected to the bus the audit verifier answers on")
        return jsonable_encoder(result)

