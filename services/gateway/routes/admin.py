"""The audit log (audit:read), and ``record``: an access change (a token made or revoked, a sign-in, a role
binding) recorded as a gateway outcome, so the audit log shows who gave access to whom. Tokens: tokens.py."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Depends, Query, Request
from fastapi.encoders import jsonable_encoder

from libs.contracts.bounds import MAX_SAFE_INT, Actor, Id, Time
from libs.contracts.commands import CommandOutcome
from libs.contracts.envelope import new_id

from ..audit_verify import AuditVerifierUnavailable
from ..auth import Permission, Principal, require
from ..errors import ApiError
from . import reads_of


async def record(request: Request, kind: str, principal: Principal, **detail: Any) -> None:
    commands = request.app.state.commands
    if commands is not None:
        await commands.record(CommandOutcome(command_id=new_id(), kind=kind, accepted=True, by="gateway",
                                             detail={"actor": principal.actor, **detail}))


def register(app: FastAPI) -> None:

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

