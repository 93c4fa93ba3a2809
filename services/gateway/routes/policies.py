"""Scheduling policies (policy:admin): ``GET/PUT /v1/policies/gang``.

The queue owns the gang policy; a PUT is the ``set_policy`` command (audited like every command, refusals by
the gateway included) and answers with the policy now in force, read back from the queue's public view.
"""

from __future__ import annotations

from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from libs.contracts.commands import SetGangPolicy
from libs.contracts.policies import GangPolicy

from ..auth import Permission, Principal, require
from ..errors import ApiError
from . import COMMAND_KEY, commands_of, reads_of


async def set_gang_policy(request: Request, principal: Principal, body: GangPolicy) -> JSONResponse:
    """The ``set_policy`` command and its answer, as ``PUT /v1/policies/gang`` gives it (the panel's policy form,
    which reads the typed numbers in the page's locale first, comes here too)."""
    sent = await commands_of(request).send(SetGangPolicy(actor=principal.actor, policy=body))
    out = sent.outcome
    if out is None:
        return JSONResponse({"command_id": sent.command_id, "status": "pending"}, status_code=202)
    if not out.accepted:
        raise ApiError(409, "refused", out.reason or "refused", detail=jsonable_encoder(out.detail),
                       command_id=sent.command_id, by=out.by)
    # Read-your-writes: the queue commits the policy before it publishes the outcome.
    return JSONResponse(jsonable_encoder(await reads_of(request).gang_policy()), status_code=200)


def register(app: FastAPI) -> None:

    @app.get("/v1/policies/gang", tags=["policies"],
             summary="The gang policy: ready timeout, back-off, sequential admission, node failure strategy")
    async def get_gang_policy(request: Request,
                              _: Principal = Depends(require(Permission.POLICY_ADMIN))) -> dict[str, Any]:
        return jsonable_encoder(await reads_of(request).gang_policy())

    @app.put("/v1/policies/gang", tags=["policies"], summary="Replace the gang policy (every field has a default)",
             openapi_extra={COMMAND_KEY: "set_policy"},
             responses={202: {"description": "Accepted for processing; no outcome yet"},
                        409: {"description": "Refused"}, 422: {"description": "Invalid policy"}})
    async def put_gang_policy(request: Request, body: GangPolicy,
                              principal: Principal = Depends(require(Permission.POLICY_ADMIN))) -> JSONResponse:
        return await set_gang_policy(request, principal, body)
