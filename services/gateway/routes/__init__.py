"""HTTP routes of the gateway, one module per area; each route declares its permission with require()."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import Response

from ..auth import Principal
from ..errors import unavailable
from ..scoping import hide_other_jobs, sees_all

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
    job_ids = sorted({r["job_id"] for r in rows if r.get("job_id")})
    owners = await reads_of(request).job_owners(job_ids) if job_ids else {}
    return hide_other_jobs(rows, owners, principal)


def json_response(body: Any, status_code: int = 200) -> Response:
    """``JSONResponse(jsonable_encoder(body))`` byte for byte, encoded in one pass: the standard encoder walks the
    body once and hands only what it cannot write itself (datetimes, ...) to ``jsonable_encoder``, instead of
    ``jsonable_encoder`` rebuilding the whole body first and ``json.dumps`` walking it again."""
    text = json.dumps(body, default=jsonable_encoder, ensure_ascii=False, allow_nan=False, indent=None,
                      separators=(",", ":"))
    return Response(text.encode("utf-8"), status_code=status_code, media_type="application/json")
