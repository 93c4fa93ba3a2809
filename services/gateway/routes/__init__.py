"""HTTP routes of the gateway, one module per area; each route declares its permission with require()."""

from __future__ import annotations

import re
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from pydantic import TypeAdapter

from libs.contracts.bounds import ID_PATTERN

from ..auth import Principal
from ..errors import not_found, unavailable
from ..scoping import hide_other_jobs, may_see, sees_all

_AS_A_ROUTE: TypeAdapter[Any] = TypeAdapter(Any)  # how FastAPI encodes a route's returned dict[str, Any]
_ID = re.compile(ID_PATTERN)
COMMAND_KEY = "x-teto-command"  # openapi_extra marker: the command kind a route issues (refusals are audited)


def reads_of(request: Request) -> Any:
    reads = request.app.state.reads
    if reads is None:
        raise unavailable()
    return reads


def commands_of(request: Request) -> Any:
    commands = request.app.state.commands
    if commands is None:
        raise unavailable()
    return commands


async def scoped_fleet(request: Request, principal: Principal, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Executor or node rows as this principal may see them: other owners' job ids hidden (scoping.py)."""
    if sees_all(principal):
        return rows
    job_ids = sorted({r["job_id"] for r in rows if r.get("job_id")}
                     | {r["left_job"]["job_id"] for r in rows if r.get("left_job")})
    owners = await reads_of(request).job_owners(job_ids) if job_ids else {}
    return hide_other_jobs(rows, owners, principal)


def json_response(body: Any, status_code: int = 200) -> Response:
    """The body as the GET routes answer it, byte for byte: FastAPI encodes a route's returned ``dict[str, Any]``
    with pydantic's JSON serializer (datetimes as ``...Z``), so a command's answer (the job it changed) reads the
    same as ``GET /v1/jobs/{id}`` right after it; encoded in one pass, in pydantic's compiled core."""
    return Response(_AS_A_ROUTE.dump_json(body), status_code=status_code, media_type="application/json")


async def existing_job(request: Request, job_id: str, principal: Principal,
                       command: str | None = None) -> dict[str, Any]:
    """The job's row, or 404 (also for a job the principal may not see: its id is not confirmed); a command
    about an unknown job is recorded as refused by the gateway."""
    job = await reads_of(request).job_row(job_id) if _ID.match(job_id) else None
    if job is None or not may_see(principal, job.get("owner")):
        err = not_found("job", job_id)
        if command is not None:
            await commands_of(request).refuse(command, principal.actor, err.body["reason"],
                                              job_id=job_id if _ID.match(job_id) else None)
        raise err
    return job
